"""Where a resumed attempt continues: the frames the relay stored for its run.

An attempt that follows another continues from everything the relay stored: the text the
attempt before knew was published (`partial_text`) and, when that attempt closed itself
with an `error` frame, that frame too (`prev_close_seq` says how many frames it
published). Both are waited for, a little (`resume_wait_ms`), so that a retry takes
nothing back and its `run` frame marks its cut after what came before it. After a crash
only the frames the relay had published but not stored yet are taken back.
"""

import asyncio
import logging
from dataclasses import dataclass

from runwire.contracts.frames import CHECKED, Frame, FrameType, Transcript
from runwire.runtime.store import Run, Store

log = logging.getLogger(__name__)

# How often a resuming attempt looks whether the relay has stored the earlier frames.
RESUME_POLL_S = 0.02
# Frames read back from the relay's segments were checked when they were made.
STORED = {CHECKED: True}


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """The frames stored for the run (contiguous from seq 1), their text, and the seq of
    the last of them: the resumed attempt's cut (`resume_after`)."""

    history: list[Frame]
    continuation: str
    after: int


def resumes(run: Run) -> bool:
    """Whether an attempt of `run` continues from an earlier one (not a fresh run)."""
    return run.attempts > 1 or run.last_seq > 0 or bool(run.partial_text)


async def _more_stored_frames(store: Store, run_id: str, frames: list[Frame]) -> None:
    """Append to `frames` the run's frames stored in Postgres segments after them, up to
    the first gap."""
    for segment in await store.segments_after(run_id, len(frames)):
        if segment.first_seq != len(frames) + 1:
            break  # frames a crashed relay published but never wrote: stop before them
        frames.extend(Frame.model_validate(body, context=STORED) for body in segment.frames)


def _previous_closed(run: Run, frames: list[Frame]) -> bool:
    """Whether `frames` hold every frame the attempt before published, its closing
    `error` frame included (nothing to wait for when it closed without one)."""
    if run.prev_close_seq is None:
        return True
    previous = run.attempts - 1
    for back, frame in enumerate(reversed(frames), start=1):
        if frame.type == FrameType.RUN and frame.data.get("attempt") == previous:
            return back >= run.prev_close_seq
    return False


async def resume_point(store: Store, run: Run, wait_ms: int) -> ResumePoint:
    """Read the run's stored frames, waiting up to `wait_ms` for the relay to store what
    the attempt before published; then resume from what is stored."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    frames: list[Frame] = []
    transcript = Transcript()
    while True:
        # Each look reads only the segments written since the one before.
        start = len(frames)
        await _more_stored_frames(store, run.run_id, frames)
        for frame in frames[start:]:
            transcript.apply(frame)
        complete = transcript.text.startswith(run.partial_text) and _previous_closed(run, frames)
        if complete or loop.time() >= deadline:
            break
        await asyncio.sleep(RESUME_POLL_S)
    if not transcript.text.startswith(run.partial_text):
        log.warning(
            "the relay has not stored all the run's frames yet; resuming from what it "
            "stored (%d characters of %d)",
            len(transcript.text),
            len(run.partial_text),
        )
    elif not complete:
        log.warning(
            "the relay has not stored the closing frames of the attempt before yet; "
            "resuming from what it stored (%d frames)",
            len(frames),
        )
    return ResumePoint(frames, transcript.text, frames[-1].seq if frames else 0)
