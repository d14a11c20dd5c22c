"""Per-run ordering: which raw frames are kept, and the run-wide `seq` each one gets.

Pure logic. An attempt numbers its frames from 1 within its generation; the relay
keeps a frame only if it is the next of the current generation, or the first of a
newer one. Frames of an older generation (an attempt that was fenced out) and
repeats are dropped; anything after `done` is dropped.
"""

from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    KEEP = "keep"
    DROP = "drop"  # stale generation, repeat, or after done: ack and forget
    WAIT = "wait"  # a gap: an earlier frame has not arrived yet


@dataclass
class RunCursor:
    """What the relay has published for one run."""

    generation: int = -1
    raw_seq: int = 0
    seq: int = 0
    closed: bool = False
    # What Postgres says of the run (see `FrameState`), to tell a real frame from a forged
    # one: its secret, the generation last claimed, whether it ended, whether it exists.
    secret: str | None = field(default=None, repr=False)
    claimed: int = 0
    ended: bool = False
    known: bool = True
    tenant: str = ""
    # The generation whose token a frame last proved (each generation's is proved once).
    proved: int | None = field(default=None, repr=False)
    proved_token: str | None = field(default=None, repr=False)

    def judge(self, generation: int, raw_seq: int) -> Verdict:
        if self.closed or generation < self.generation:
            return Verdict.DROP
        if generation == self.generation:
            if raw_seq <= self.raw_seq:
                return Verdict.DROP
            return Verdict.KEEP if raw_seq == self.raw_seq + 1 else Verdict.WAIT
        return Verdict.KEEP if raw_seq == 1 else Verdict.WAIT

    def advance(self, generation: int, raw_seq: int, is_done: bool) -> int:
        """Record a kept frame; returns its run-wide seq."""
        self.generation = generation
        self.raw_seq = raw_seq
        self.seq += 1
        self.closed = self.closed or is_done
        return self.seq
