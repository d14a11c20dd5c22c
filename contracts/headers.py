"""Message headers of the wire contract.

`traceparent` (W3C Trace Context) is optional on every command request and is set by
runwire on the messages it publishes for a run (jobs, frames, run events): its value
names the run's trace, so a client that traces can continue it. FastStream's
`NatsTelemetryMiddleware` reads and writes the same header.
"""

TRACEPARENT = "traceparent"

# On a join reply whose replay was cut at the relay's size limit: the seq of the reply's
# last frame, the cursor to join from for the rest. A client may send that next join as
# soon as the reply arrives, before it reads the reply's body; the body alone stays
# complete without it (`live` is null and the last frame's seq is the same cursor).
REPLAY_NEXT = "Runwire-Replay-Next"
