"""An attempt's frames on their way to the frames stream: one at a time, in order.

Each frame is numbered after the run's last stored frame and stored only if that one is
still the last (see `runwire.runtime.frame_chain`), so an attempt sends its next frame
when the one before is acknowledged. Meanwhile text deltas join the `message` frame
waiting to go (`coalesce_text`, up to COALESCE_MAX_CHARS): a runner that emits faster
than frames are stored sends fewer, larger frames (a client sees the same text), and one
that emits slower sends each delta at once. With `coalesce_ms`, a delta that follows a
`message` frame waits that long for later ones, whatever the pace (the first delta after
any other frame still goes at once).

A frame the stream refuses because another was stored first fences the attempt out
(a newer attempt, or a service closing the run, got there), unless what was stored is
this very frame (a try whose acknowledgement was lost) or the frames of an older attempt
(which this one, newer, goes on after).
"""

import asyncio
import contextlib
import io
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_json

from runwire.contracts.frames import Frame, FrameType, typed_data
from runwire.runtime.broker import Broker, ChainMoved, frame_msg_id
from runwire.runtime.commands import describe
from runwire.runtime.errors import (
    InvalidRequest,
    LostRace,
    PayloadTooLarge,
    RunwireError,
    Unavailable,
)
from runwire.runtime.frame_chain import Tail, read_tail
from runwire.runtime.logs import fields
from runwire.runtime.settings import ExecutorSettings

log = logging.getLogger(__name__)

# A failed publish is tried again after this long, times the tries so far, at most
# PUBLISH_RETRY_MAX_S, until the executor's `publish_patience_ms` has passed.
PUBLISH_RETRY_S = 0.2
PUBLISH_RETRY_MAX_S = 1.0
# Frames waiting to go before the runner waits for room.
PUBLISH_WINDOW = 256
# The most text one coalesced `message` frame holds (characters).
COALESCE_MAX_CHARS = 16_384


@dataclass
class _Out:
    """A frame waiting to go: its type and data (for a `message`, the deltas joined in
    it), its place in the attempt's frames, when it was emitted, and the soonest it may
    go (`coalesce_ms`; 0: at once)."""

    type: FrameType
    data: dict[str, Any] | None
    raw_seq: int
    at: datetime
    due: float = 0.0
    parts: list[str] | None = None
    size: int = 0
    # Whether later text deltas may join it (a `message` frame that is not to go at once).
    joins: bool = False

    def body(self) -> dict[str, Any]:
        if self.parts is not None:
            return {"text": "".join(self.parts)}
        assert self.data is not None
        return self.data


class FrameSender:
    """Sends one attempt's frames, in order, each after the one before is stored."""

    def __init__(
        self,
        broker: Broker,
        settings: ExecutorSettings,
        *,
        tenant: str,
        run_id: str,
        generation: int,
        traceparent: str | None,
        on_fenced: Callable[[], None],
    ) -> None:
        self._broker = broker
        self._settings = settings
        self._tenant = tenant
        self._run_id = run_id
        self._generation = generation
        self._traceparent = traceparent
        self._on_fenced = on_fenced
        self._queue: deque[_Out] = deque()
        self._tail = Tail()
        # How many frames this attempt has emitted (its raw seq), and sent at least once.
        self.emitted = 0
        self.sent = 0
        # Text of this attempt's message frames known to be stored, in order.
        self.text = io.StringIO()
        self._last_type: FrameType | None = None
        # Whether a frame is queued or on its way (a delta emitted meanwhile may wait).
        self._busy = False
        self._failure: RunwireError | None = None
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Set by `sync` until the frames queued are sent: none is held meanwhile.
        self._flushing = False

    async def start(self, archived_seq: int, fresh: bool) -> None:
        """Learn where the run's frames end (a fresh run has none: nothing to ask; if it
        has some after all, the stream says so at its first frame)."""
        if not fresh:
            self._tail = await read_tail(self._broker, self._tenant, self._run_id, archived_seq)
        self._task = asyncio.create_task(self._send_all())

    @property
    def tail(self) -> Tail:
        """The run's last stored frame, as far as this attempt knows."""
        return self._tail

    def put(self, type: FrameType, data: dict[str, Any], coalesce: bool) -> None:
        """Queue a frame (`data` checked against its type now: a runner hears of a bad
        one at its call)."""
        if self._failure is not None:
            raise self._failure
        text = data.get("text") if type == FrameType.MESSAGE and len(data) == 1 else None
        # What a frame of joined deltas may hold: its JSON stays well under the message
        # limit (a character is at most 6 bytes of it, escaped).
        most = min(COALESCE_MAX_CHARS, self._broker.max_frame_bytes // 8)
        if isinstance(text, str) and coalesce and len(text) < most:
            tail = self._queue[-1] if self._queue else None
            if tail is not None and tail.joins and tail.size + len(text) <= most:
                assert tail.parts is not None
                tail.parts.append(text)
                tail.size += len(text)
                return
            out = self._queued(type, None)
            out.parts, out.size = [text], len(text)
            hold = self._settings.coalesce_ms / 1000
            after_text = self._last_type == FrameType.MESSAGE
            if hold and after_text:
                out.due = asyncio.get_running_loop().time() + hold
            # The first delta after any other frame goes at once, as does one with no
            # frame on its way; later deltas join the one waiting.
            out.joins = bool(out.due) or (after_text and self._busy)
        else:
            self._check(type, data)
            out = self._queued(type, data)
        self._last_type = type
        self._busy = True
        self._queue.append(out)
        self._drained.clear()
        self._wake.set()

    def _queued(self, type: FrameType, data: dict[str, Any] | None) -> _Out:
        self.emitted += 1
        return _Out(type, data, self.emitted, datetime.now(UTC))

    def _check(self, type: FrameType, data: dict[str, Any]) -> None:
        try:
            typed_data(type, data)
            size = len(to_json(data))
        except ValidationError as exc:  # data that does not fit the frame type's model
            raise InvalidRequest(f"a {type.value} frame's data: {describe(exc)}") from exc
        except ValueError as exc:  # data that is not JSON
            raise InvalidRequest(f"a {type.value} frame's data is not JSON: {exc}") from exc
        if size > self._broker.max_frame_bytes:
            # It could never be published: fail the attempt for good, not over and over.
            raise PayloadTooLarge(
                f"a {type.value} frame of {size} bytes is over the limit of "
                f"{self._broker.max_frame_bytes} bytes"
            )

    async def room(self) -> None:
        """Wait while too many frames wait to go (the runner goes no faster than NATS)."""
        while len(self._queue) >= PUBLISH_WINDOW and self._failure is None:
            self._room.clear()
            await self._room.wait()

    async def sync(self) -> None:
        """Send every frame queued, held ones at once; raise why one could not be."""
        self._flushing = True
        self._wake.set()
        await self._drained.wait()
        if self._failure is not None:
            raise self._failure

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _send_all(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._busy = self._flushing = False
                self._drained.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            head = self._queue[0]
            wait = head.due - loop.time()
            if wait > 0 and len(self._queue) == 1 and not self._flushing:
                # A held delta: later ones may join it, until its time is up.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            try:
                await self._send(self._queue.popleft())
            except RunwireError as exc:
                self._failure = exc
                self._queue.clear()
                self._drained.set()
                self._room.set()
                return
            if len(self._queue) < PUBLISH_WINDOW:
                self._room.set()

    async def _send(self, out: _Out) -> None:
        """Send one frame until it is stored (within patience), after the run's last."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.publish_patience_ms / 1000
        data = out.body()
        tries = 0
        self.sent = max(self.sent, out.raw_seq)
        while True:
            frame = Frame.model_construct(
                run_id=self._run_id, seq=self._tail.seq + 1, type=out.type, data=data, at=out.at
            )
            body = frame.model_dump_json().encode()  # once: size check and publish
            if len(body) > self._broker.max_frame_bytes:
                # It could never be published: fail the attempt for good, not over and over.
                raise PayloadTooLarge(
                    f"a {out.type.value} frame of {len(body)} bytes is over the limit of "
                    f"{self._broker.max_frame_bytes} bytes"
                )
            try:
                sent = await self._broker.send_frame(
                    self._tenant,
                    frame,
                    body,
                    self._generation,
                    out.raw_seq,
                    self._tail.stream_seq,
                    traceparent=self._traceparent,
                )
                stream_seq = await sent
            except ChainMoved:
                stored = await self._moved(out)
                if stored is None:
                    continue  # older frames came first: numbered again after them
                stream_seq = stored
            except Unavailable:
                # JetStream without a leader for this stream (an election after a server
                # died takes seconds): the same frame again, within patience.
                tries += 1
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(min(PUBLISH_RETRY_MAX_S, PUBLISH_RETRY_S * tries))
                continue
            break
        self._tail = Tail(
            stream_seq,
            frame.seq,
            self._generation,
            out.raw_seq,
            out.type.value,
            frame_msg_id(self._run_id, self._generation, out.raw_seq),
        )
        if out.type == FrameType.MESSAGE:
            self.text.write(str(data.get("text", "")))

    async def _moved(self, out: _Out) -> int | None:
        """Another frame was stored on the run's subject first: this frame's stream seq if
        it was this very frame, None to number it again after older attempts' frames;
        else this attempt is fenced out."""
        tail = await read_tail(self._broker, self._tenant, self._run_id, self._tail.seq)
        if tail.msg_id == frame_msg_id(self._run_id, self._generation, out.raw_seq):
            return tail.stream_seq
        if tail.generation < self._generation and tail.type != FrameType.DONE.value:
            self._tail = tail
            return None
        log.warning(
            "the attempt's frame was refused: a newer attempt or the run's end came first",
            extra=fields(generation=self._generation, raw_seq=out.raw_seq),
        )
        self._on_fenced()
        raise LostRace(f"attempt {self._generation} of run {self._run_id} was fenced out")
