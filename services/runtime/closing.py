"""The last frames of a run closed outside an attempt (canceled while queued, queue
full or timed out, interrupted by recovery).

They are published as a generation above every attempt's, so the relay accepts them
after anything an attempt sent and drops whatever a zombie attempt sends later.
"""

from datetime import UTC, datetime

from contracts.frames import FrameType, RawFrame
from contracts.status import RunStatus
from services.runtime.broker import Broker
from services.runtime.store import Run


def closing_frames(run: Run) -> list[RawFrame]:
    """An `error` frame when the run did not finish or was not canceled, then `done`."""
    now = datetime.now(UTC)
    generation = run.generation + 1
    frames: list[RawFrame] = []
    code = run.error.get("code") if run.error else None
    if run.status not in (RunStatus.FINISHED, RunStatus.CANCELED) and run.error:
        frames.append(
            RawFrame(
                run_id=run.run_id,
                tenant=run.tenant,
                generation=generation,
                seq=1,
                type=FrameType.ERROR,
                data=dict(run.error),
                at=now,
            )
        )
    done: dict[str, object] = {"status": run.status.value}
    if run.status != RunStatus.FINISHED and code:
        done["code"] = code
    frames.append(
        RawFrame(
            run_id=run.run_id,
            tenant=run.tenant,
            generation=generation,
            seq=len(frames) + 1,
            type=FrameType.DONE,
            data=done,
            at=now,
        )
    )
    return frames


async def publish_closing(broker: Broker, run: Run) -> None:
    """Publish a closed run's last frames (idempotent: same message ids every time)."""
    for frame in closing_frames(run):
        await broker.publish_raw_frame(frame, traceparent=run.trace_parent)
