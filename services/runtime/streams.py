"""The streams and durable consumers runwire declares on JetStream (a part of the
broker: `Broker` is a `StreamAdmin`)."""

import asyncio
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DiscardPolicy,
    RePublish,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)

from runwire.contracts.subjects import Subjects
from runwire.runtime.errors import Unavailable
from runwire.runtime.settings import DEFAULT_FRAME_FOLLOWERS, CommonSettings

DUPLICATE_WINDOW_S = 120.0
DECLARE_TRIES = 8
# How long a stream declaration waits for an answer (an unanswered one is looked at
# again, see `_declare_stream`).
DECLARE_TIMEOUT_S = 1.0
# The most consumers the server lists in one answer.
CONSUMER_PAGE = 256
EVENTS_MAX_AGE_S = 7 * 24 * 3600
# The executors' durable consumers on the jobs stream: `executor-<runner>`, one per runner.
# (Before per-runner jobs, one consumer named just `executor` took every job.)
EXECUTOR_CONSUMER = "executor"


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """Stream settings every service declares alike (create-or-update at start-up)."""

    queue_capacity: int
    frame_max_age_s: int
    replicas: int = 1
    frame_followers: int = DEFAULT_FRAME_FOLLOWERS

    @classmethod
    def of(cls, settings: CommonSettings) -> "StreamLimits":
        return cls(
            settings.queue_capacity,
            settings.frame_stream_max_age_s,
            settings.stream_replicas,
            settings.max_frame_followers,
        )


class StreamAdmin:
    """Declaring and listing streams and consumers, over the broker's connection."""

    js: JetStreamContext
    # Stream declarations wait less than other requests (DECLARE_TIMEOUT_S).
    _declaring: JetStreamContext
    subjects: Subjects

    async def ensure_streams(self, limits: "StreamLimits") -> None:
        """Create or update the jobs, run events and frames streams."""
        s = self.subjects
        queue_capacity, frame_max_age_s = limits.queue_capacity, limits.frame_max_age_s
        replicas = limits.replicas
        await self._ensure_stream(
            StreamConfig(
                name=s.jobs_stream,
                subjects=[s.jobs_wildcard],
                retention=RetentionPolicy.WORK_QUEUE,
                max_msgs=queue_capacity,
                discard=DiscardPolicy.NEW,
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=replicas,
            )
        )
        await self._ensure_stream(
            StreamConfig(
                name=s.events_stream,
                subjects=[s.events_wildcard],
                retention=RetentionPolicy.LIMITS,
                max_age=float(EVENTS_MAX_AGE_S),
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=replicas,
            )
        )
        await self._ensure_stream(
            StreamConfig(
                name=s.run_frames_stream,
                # Attempts publish a run's frames on `frames_out`, each numbered and fenced
                # by the last one stored (Nats-Expected-Last-Subject-Sequence); the stream
                # stores them under the run's client subject, and republishes only what it
                # stored on the run's live subject for plain subscribers (a refused publish
                # reaches nobody).
                # The client subjects too, so that a client finds the stream by a run's
                # subject (what the official clients do); nobody may publish on them.
                subjects=[s.frames_out_wildcard, s.run_frames_wildcard],
                subject_transform=SubjectTransform(
                    src=s.frames_out_wildcard, dest=s.frames_out_stored
                ),
                republish=RePublish(src=s.run_frames_wildcard, dest=s.frames_live_republished),
                retention=RetentionPolicy.LIMITS,
                max_age=float(frame_max_age_s),
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=replicas,
                allow_direct=True,
                # Each client following a run live is a consumer of this stream (kept a
                # few seconds after it stops following). Left unset, nats-server 2.15
                # refuses the 1001st, and every later follower falls back to joins.
                max_consumers=limits.frame_followers,
            )
        )

    async def _ensure_stream(self, config: StreamConfig) -> None:
        try:
            await self._declare_stream(config)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"cannot declare stream {config.name}: {exc}") from exc

    async def _declare_stream(self, config: StreamConfig) -> None:
        assert config.name is not None
        # Several services declare the same streams as they start: create it, or update
        # it if it exists; a race with another declaration is settled by trying again.
        for attempt in range(DECLARE_TRIES):
            try:
                try:
                    await self._declaring.stream_info(config.name)
                except nats.js.errors.NotFoundError:
                    await self._declaring.add_stream(config)
                    return
                await self._declaring.update_stream(config)
                return
            except (nats.js.errors.APIError, nats.errors.TimeoutError):
                # On a cluster the meta leader leaves a create unanswered while another
                # replica's create of the same stream is under way: look again.
                if attempt == DECLARE_TRIES - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))

    async def ensure_consumer(
        self,
        stream: str,
        durable: str,
        *,
        max_ack_pending: int,
        ack_wait_s: float,
        filter_subject: str | None = None,
    ) -> None:
        """Create or reconcile a durable pull consumer from settings (full config)."""
        await self.js.add_consumer(
            stream,
            ConsumerConfig(
                durable_name=durable,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=ack_wait_s,
                max_ack_pending=max_ack_pending,
                max_deliver=-1,
                max_waiting=512,
                filter_subject=filter_subject,
            ),
        )

    async def delete_consumer(self, stream: str, durable: str) -> bool:
        """Remove a consumer if it exists; True when one was removed."""
        try:
            return bool(await self.js.delete_consumer(stream, durable))
        except nats.js.errors.NotFoundError:
            return False
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"cannot remove consumer {durable} of {stream}: {exc!r}") from exc

    async def stream_messages(self, stream: str) -> int | None:
        """How many messages `stream` holds; None when there is no such stream."""
        try:
            info = await self._declaring.stream_info(stream)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"stream {stream} unavailable: {exc!r}") from exc
        return int(info.state.messages)

    async def delete_stream(self, stream: str) -> bool:
        """Remove a stream (of an earlier version, that nothing uses any more) and its
        consumers; True when one was removed."""
        try:
            return bool(await self._declaring.delete_stream(stream))
        except nats.js.errors.NotFoundError:
            return False
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"cannot remove stream {stream}: {exc!r}") from exc

    async def consumers_of(self, stream: str) -> list[ConsumerInfo]:
        """Every consumer of `stream`, with its configuration (read a page at a time)."""
        found: list[ConsumerInfo] = []
        try:
            while True:
                page = await self.js.consumers_info(stream, offset=len(found) or None)
                found += page
                if len(page) < CONSUMER_PAGE:
                    return found
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"listing the consumers of {stream} failed: {exc}") from exc

    async def consumer_of(self, stream: str, name: str) -> ConsumerInfo | None:
        """One consumer of `stream` with its configuration; None if there is none."""
        try:
            info: ConsumerInfo = await self.js.consumer_info(stream, name)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"reading consumer {name} of {stream} failed: {exc}") from exc
        return info

    async def pull(self, stream: str, durable: str) -> JetStreamContext.PullSubscription:
        return await self.js.pull_subscribe_bind(durable=durable, stream=stream)
