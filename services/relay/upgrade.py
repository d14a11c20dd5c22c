"""Upgrading to one store per frame: the raw-frames stream of earlier versions goes.

Before, attempts published raw frames to a work-queue stream (`<PREFIX>_FRAMES_IN`) that
relays consumed in partitions (`relay-0` .. `relay-15`), numbered and republished. Now
attempts publish numbered frames straight to the frames stream, and nothing reads the
raw-frames stream any more. A relay removes it as it starts, with its consumers, once
it is empty; one that still holds raw frames is left alone and logged as an error: they
are frames of runs of the previous version, which only a relay of that version can
deliver (docs/deploying.md, "Upgrading to one store per frame").
"""

import logging

from runwire.runtime.broker import Broker
from runwire.runtime.errors import RunwireError

log = logging.getLogger(__name__)


async def retire_raw_frames(broker: Broker) -> None:
    """Remove the raw-frames stream of earlier versions and its consumers if it is there
    and empty (best effort: logged, never raised)."""
    stream = broker.subjects.frames_in_stream
    try:
        held = await broker.stream_messages(stream)
        if held is None:
            return
        if held:
            log.error(
                "the raw-frames stream %s of an earlier version still holds %d raw frames: "
                "they reach no client and no segment now. Drain it with the previous "
                "version first (stop submitting, keep its relays running until the stream "
                "is empty), then deploy this one; see docs/deploying.md, 'Upgrading to one "
                "store per frame'",
                stream,
                held,
            )
            return
        # The consumers first: an identity that may not remove streams still removes
        # them (the operator removes the stream then).
        for consumer in await broker.consumers_of(stream):
            if consumer.name and await broker.delete_consumer(stream, consumer.name):
                log.info("removed the raw-frames consumer %s of an earlier version", consumer.name)
        await broker.delete_stream(stream)
    except RunwireError as exc:
        log.warning("the raw-frames stream %s of an earlier version not removed: %s", stream, exc)
        return
    except Exception:
        # Best effort (a NATS identity that may not remove it, a timeout): archiving goes on.
        log.exception("the raw-frames stream %s of an earlier version not removed", stream)
        return
    log.info("removed the empty raw-frames stream %s of an earlier version", stream)
