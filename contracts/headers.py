"""Message headers of the wire contract.

`traceparent` (W3C Trace Context) is optional on every command request and is set by
runwire on the messages it publishes for a run (jobs, raw frames, run events): its value
names the run's trace, so a client that traces can continue it. FastStream's
`NatsTelemetryMiddleware` reads and writes the same header.
"""

TRACEPARENT = "traceparent"
