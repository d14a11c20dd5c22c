"""Named fault points for crash tests.

The code awaits `point(name)` at a boundary where a crash must lose nothing (after a
commit, before its messages are published; after a sweep published, before it
recorded so). A test arms points with the setting `RUNWIRE_FAULT_POINTS`
(`name=kill,other=kill`): the task that reaches the point goes no further, and the
process kills itself with SIGKILL a moment later, once what it had already sent has
left its connections, as a crash just after the boundary would, with no clean-up of
any kind. Unarmed, a point costs a dict lookup.
"""

import asyncio
import logging
import os
import signal

log = logging.getLogger(__name__)

# After a transition committed, before its service publishes what it implies.
OUTBOX_COMMITTED = "outbox.committed"
# After the sweep published its batch, before it deleted the rows it published.
OUTBOX_SWEPT = "outbox.swept"

# A relay is about to write a run's last frames (`done` among them) to Postgres: it has
# acknowledged none of them yet.
RELAY_UNWRITTEN = "relay.unwritten"

# A side effect: persisted (prepared), claimed for a dispatch, dispatched (the adapter
# answered) but not committed, committed (its attempt not ended yet).
EFFECT_PREPARED = "effect.prepared"
EFFECT_CLAIMED = "effect.claimed"
EFFECT_DISPATCHED = "effect.dispatched"
EFFECT_COMMITTED = "effect.committed"
# A costly call was made and its budget reservation is not settled yet.
BUDGET_UNSETTLED = "budget.unsettled"

# A workflow's node run: its attempt claimed (the node running in Postgres) before its
# runner starts; its outcome committed (with what it implies for the workflow: the next
# nodes and their jobs, a fallback, the node frame, the workflow's end) before that is
# published; a node's timeout committed by recovery, before it published what follows.
NODE_CLAIMED = "node.claimed"
NODE_SETTLED = "node.settled"
NODE_TIMED_OUT = "node.timed_out"
# Waits past their timeout decided `timed_out` by recovery and their runs queued
# (committed), before the jobs of their next attempts are published.
WAIT_TIMED_OUT = "wait.timed_out"
# A schedule's fires committed by recovery (their runs made, with the next fire), before
# the runs' jobs are published.
SCHEDULE_FIRED = "schedule.fired"

KNOWN = frozenset(
    {
        NODE_CLAIMED,
        NODE_SETTLED,
        NODE_TIMED_OUT,
        WAIT_TIMED_OUT,
        SCHEDULE_FIRED,
        OUTBOX_COMMITTED,
        OUTBOX_SWEPT,
        RELAY_UNWRITTEN,
        EFFECT_PREPARED,
        EFFECT_CLAIMED,
        EFFECT_DISPATCHED,
        EFFECT_COMMITTED,
        BUDGET_UNSETTLED,
    }
)
# kill: SIGKILL, a crash; stop: SIGSTOP, a process frozen until someone sends SIGCONT
# (once: a point that stopped the process is disarmed).
ACTIONS = frozenset({"kill", "stop"})

# Time for writes already buffered (a publish, an acknowledgement) to leave the process.
KILL_AFTER_S = 0.3

_armed: dict[str, str] = {}


class FaultSpecError(ValueError):
    """A fault point setting that names an unknown point or action."""


def parse(spec: str) -> dict[str, str]:
    """`name=action,...` as a dict; raises FaultSpecError for anything unknown."""
    armed: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, action = part.partition("=")
        if name not in KNOWN:
            raise FaultSpecError(f"unknown fault point {name!r}; known: {', '.join(sorted(KNOWN))}")
        if action not in ACTIONS:
            raise FaultSpecError(
                f"unknown fault action {action!r} for {name}; known: {', '.join(sorted(ACTIONS))}"
            )
        armed[name] = action
    return armed


def arm(spec: str) -> None:
    """Arm the points of `spec` for this process (an empty spec disarms all)."""
    _armed.clear()
    _armed.update(parse(spec))
    if _armed:
        log.warning("fault points armed: %s", spec)


async def point(name: str) -> None:
    """A boundary: does nothing unless a test armed it."""
    action = _armed.get(name)
    if action == "kill":
        log.warning("fault point %s: killing this process", name)
        await asyncio.sleep(KILL_AFTER_S)
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        del _armed[name]
        log.warning("fault point %s: stopping this process until SIGCONT", name)
        await asyncio.sleep(KILL_AFTER_S)
        os.kill(os.getpid(), signal.SIGSTOP)
