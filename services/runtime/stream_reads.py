"""Reading streams back: a run's stored frames, the jobs a stream holds, the newest
message of a subject (a part of the broker: `Broker` is a `StreamReads`)."""

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import NamedTuple

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runwire.contracts.subjects import Subjects
from runwire.runtime.errors import Unavailable

log = logging.getLogger(__name__)

# How long a read of a stream waits for its answer.
READ_TIMEOUT_S = 5.0
# A Direct Get answered by a replica behind the stream's leader is asked again this many
# times, after READ_BEHIND_DELAY_S times the tries so far (about 2 s in all).
READ_BEHIND_TRIES = 12
READ_BEHIND_DELAY_S = 0.03
# A range read that ends short of its end (messages purged, or a replica behind) is asked
# again this many times before it is taken as what the stream holds.
READ_SHORT_TRIES = 3
# The most bytes of one batched read (the server ends the batch there, and says that
# more is left).
READ_MAX_BYTES = 8 * 1024 * 1024
# Where a frame stands, in one header of the message it was stored with: "<generation>
# <raw seq> <seq> <type>" (the attempt that published it, its place among that attempt's
# frames, its seq in the run; read back to learn where a run's frames end). One header,
# not four: every client parses every header of every frame it receives.
HDR_POSITION = "Rw-Pos"
# The four headers of frames published before runwire packed them (still read).
HDR_GENERATION = "Rw-Generation"
HDR_RAW_SEQ = "Rw-Raw-Seq"
HDR_FRAME_SEQ = "Rw-Seq"
HDR_FRAME_TYPE = "Rw-Type"


@dataclass(frozen=True, slots=True)
class StoredMsg:
    """A message read back from a stream: its stream sequence, headers and body."""

    stream_seq: int
    headers: dict[str, str]
    data: bytes


class FramePosition(NamedTuple):
    """A published client frame's place: its attempt, its seq in the attempt, its seq in
    the run, its type."""

    generation: int
    raw_seq: int
    seq: int
    type: str


def frame_position(headers: dict[str, str]) -> FramePosition | None:
    """The position a client frame was published with; None for a message that has none
    (or a damaged one)."""
    try:
        packed = headers.get(HDR_POSITION)
        if packed is not None:
            generation, raw_seq, seq, type = packed.split(" ")
            return FramePosition(int(generation), int(raw_seq), int(seq), type)
        if HDR_GENERATION in headers:
            return FramePosition(
                int(headers[HDR_GENERATION]),
                int(headers[HDR_RAW_SEQ]),
                int(headers[HDR_FRAME_SEQ]),
                headers.get(HDR_FRAME_TYPE, ""),
            )
    except (KeyError, ValueError):
        pass
    return None


class StreamReads:
    """Reads of what the streams hold, over the broker's connection."""

    nc: NatsClient
    js: JetStreamContext
    subjects: Subjects

    async def last_on_subject(self, stream: str, subject: str) -> StoredMsg | None:
        """The newest message on a subject, or None if the stream holds none."""
        try:
            raw = await self.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"reading {subject} failed: {exc}") from exc
        headers = {k: str(v) for k, v in (raw.headers or {}).items()}
        return StoredMsg(int(raw.seq or 0), headers, raw.data or b"")

    async def jobs_waiting(self) -> set[str] | None:
        """Run ids with a job in the jobs stream, from one stream info request; None when
        the answer is incomplete (more subjects than one reply holds) or unavailable,
        and `job_queued` must be asked run by run."""
        jobs = await self.jobs_by_run()
        return None if jobs is None else set(jobs)

    async def served_runners(self) -> set[str] | None:
        """The runners whose jobs some executor takes: those with a consumer on the jobs
        stream (an executor declares its runners' consumers as it starts; a durable one
        stays while the executors are away). None when the stream cannot be asked."""
        try:
            consumers = await self.js.consumers_info(self.subjects.jobs_stream)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.warning("the jobs stream's consumers not listed: %s", exc)
            return None
        served: set[str] = set()
        for consumer in consumers:
            config = consumer.config
            for subject in [config.filter_subject, *(config.filter_subjects or [])]:
                if subject:
                    # `<prefix>.jobs.<runner>.*.job`, the filter of `jobs_of(runner)`.
                    served.add(subject.split(".")[-3])
        return served

    async def drop_job(self, runner: str, run_id: str) -> None:
        """Remove a run's job from the jobs stream (a run that ended without an attempt:
        no executor may be there to take it, and it would hold a place of the queue)."""
        await self.purge_subject(self.subjects.jobs_stream, self.subjects.job(runner, run_id))

    async def jobs_by_run(self) -> dict[str, str] | None:
        """Run id → runner of every job in the jobs stream, from one stream info request;
        None when the answer is incomplete or unavailable (see `jobs_waiting`)."""
        try:
            info = await self.js.stream_info(
                self.subjects.jobs_stream, subjects_filter=self.subjects.jobs_wildcard
            )
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.warning("jobs stream not listed: %s", exc)
            return None
        subjects = info.state.subjects or {}
        if sum(subjects.values()) < info.state.messages:
            return None
        # `<prefix>.jobs.<runner>.<run_id>.job`
        return {subject.split(".")[-2]: subject.split(".")[-3] for subject in subjects}

    async def job_queued(self, runner: str, run_id: str) -> bool:
        """Whether the jobs stream still holds a job of this run."""
        last = await self.last_on_subject(
            self.subjects.jobs_stream, self.subjects.job(runner, run_id)
        )
        return last is not None

    async def purge_subject(self, stream: str, subject: str) -> None:
        """Drop every message of one subject from a stream."""
        try:
            await self.js.purge_stream(stream, subject=subject)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"purging {subject} failed: {exc}") from exc

    async def stream_position(self, stream: str) -> tuple[int, str]:
        """The stream's last sequence, and when it was made (a stream made anew numbers
        its messages from 1 again)."""
        try:
            info = await self.js.stream_info(stream)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"stream {stream} unavailable: {exc}") from exc
        created = info.created.isoformat() if info.created else ""
        return int(info.state.last_seq), created

    async def last_stream_seq(self, stream: str) -> int:
        return (await self.stream_position(stream))[0]

    async def read_subject(
        self, stream: str, subject: str, start_seq: int, end_seq: int, *, batch: int = 1000
    ) -> list[StoredMsg]:
        """Every message on `subject` with stream seq in [start_seq, end_seq], where
        `end_seq` is a message on the subject read from the stream's leader (its last).

        Uses the server's batched Direct Get (one request per `batch` messages), which
        nats-py does not wrap: replies stream to an inbox and end with a 204 status. On a
        cluster every replica of the stream answers Direct Gets, and one that is behind
        the leader (just restarted, or slow) answers without the newest messages: a read
        that ends before `end_seq` is made again, until it reaches it or
        READ_BEHIND_TRIES have failed (Unavailable).
        """
        found: list[StoredMsg] = []
        seq = start_seq
        behind = 0
        while seq <= end_seq:
            got, more = await self._direct_get_batch(stream, subject, seq, batch)
            for m in got:
                if m.stream_seq > end_seq:
                    return found
                found.append(m)
            if got and (len(got) == batch or more):
                seq = got[-1].stream_seq + 1
                continue
            if got and got[-1].stream_seq == end_seq:
                break
            behind += 1
            if behind >= READ_BEHIND_TRIES:
                raise Unavailable(
                    f"reading {subject} from {stream}: the replica that answers has not "
                    f"stored stream seq {end_seq} yet"
                )
            if got:
                seq = got[-1].stream_seq + 1
            await asyncio.sleep(READ_BEHIND_DELAY_S * behind)
        return found

    async def read_range(
        self, stream: str, subjects: str, start_seq: int, end_seq: int, *, batch: int = 1000
    ) -> tuple[list[StoredMsg], bool]:
        """Messages on `subjects` (a filter) with stream seq in [start_seq, end_seq], the
        first `batch` or fewer (a batch ends early at READ_MAX_BYTES); and whether that is
        all the range holds (False: read on from after the last of them).

        The stream may hold fewer (purged, expired), or the replica that answers may be
        behind the leader (it lacks the newest): a read that ends short of `end_seq` with
        nothing more to send is made again a few times, then the leader is asked for the
        next message after it; Unavailable while the leader has one there."""
        got: list[StoredMsg] = []
        for short in range(READ_SHORT_TRIES):
            if short:
                await asyncio.sleep(READ_BEHIND_DELAY_S * short)
            sent, more = await self._direct_get_batch(stream, subjects, start_seq, batch)
            got = [m for m in sent if m.stream_seq <= end_seq]
            if len(got) < len(sent) or (got and got[-1].stream_seq == end_seq):
                return got, True
            if got and (len(got) == batch or more):
                return got, False
        after = got[-1].stream_seq + 1 if got else start_seq
        if await self._leader_holds(stream, subjects, after, end_seq):
            raise Unavailable(
                f"reading {stream}: the replica that answers has not stored stream seq "
                f"{end_seq} yet"
            )
        return got, True

    async def _leader_holds(self, stream: str, subjects: str, start_seq: int, end_seq: int) -> bool:
        """Whether the stream's leader holds a message on `subjects` in [start_seq,
        end_seq] (a Get of the stream's API, which its leader answers)."""
        try:
            raw = await self.js.get_msg(stream, seq=start_seq, subject=subjects, next=True)
        except nats.js.errors.NotFoundError:
            return False
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"reading {stream} failed: {exc}") from exc
        return raw.seq is not None and raw.seq <= end_seq

    async def _direct_get_batch(
        self, stream: str, subject: str, seq: int, batch: int
    ) -> tuple[list[StoredMsg], bool]:
        """Up to `batch` messages on `subject` from `seq` on (fewer past READ_MAX_BYTES),
        and whether the answering server has more of them after the last it sent."""
        inbox = self.nc.new_inbox()
        out: list[StoredMsg] = []
        finished = asyncio.Event()
        more = False

        async def collect(msg: Msg) -> None:
            nonlocal more
            headers = msg.headers or {}
            status = headers.get("Status")
            if status is not None:
                # 204 end of batch (with what is left after it), or 404 nothing at/after seq
                more = headers.get("Nats-Num-Pending", "0") not in ("", "0")
                finished.set()
                return
            out.append(StoredMsg(int(headers.get("Nats-Sequence", "0")), headers, msg.data))

        request = {"seq": seq, "next_by_subj": subject, "batch": batch, "max_bytes": READ_MAX_BYTES}
        try:
            sub = await self.nc.subscribe(inbox, cb=collect)
            try:
                await self.nc.publish(
                    f"$JS.API.DIRECT.GET.{stream}", json.dumps(request).encode(), reply=inbox
                )
                await asyncio.wait_for(finished.wait(), timeout=READ_TIMEOUT_S)
            finally:
                await sub.unsubscribe()
        except TimeoutError as exc:
            raise Unavailable(f"reading {subject} from {stream} timed out") from exc
        except (nats.errors.Error, OSError) as exc:
            raise Unavailable(f"reading {subject} from {stream} failed: {exc}") from exc
        return out, more
