"""The relay's queries: where a run's frames stand, its frame segments, and the one
write per flush."""

import uuid
from collections.abc import Sequence

from runwire.runtime.store.queries import Queries
from runwire.runtime.store.rows import (
    Segment,
    SegmentCount,
    SegmentText,
    StoredSegment,
    parse_run_id,
)


class RelayQueries(Queries):
    """Frame segments as the relay writes and replays them."""

    async def segment_texts_after(self, run_id: str, after: int, limit: int) -> list[SegmentText]:
        """The run's first `limit` segments with a frame after `after`, in order, each
        with its frames' JSON."""
        key = parse_run_id(run_id)
        if key is None:
            return []
        rows = await self._fetch("segment_texts_after", key, after, limit)
        return [
            SegmentText(r["first_seq"], r["last_seq"], r["last_stream_seq"], r["frames"])
            for r in rows
        ]

    async def segments_after(self, run_id: str, after: int) -> list[StoredSegment]:
        rows = await self._fetch("segments_after", uuid.UUID(run_id), after)
        return [
            StoredSegment(
                r["first_seq"], r["last_seq"], r["last_stream_seq"], r["frames"], r["size"]
            )
            for r in rows
        ]

    async def segment_ranges(self, run_id: str) -> list[tuple[int, int, int]]:
        """(first_seq, last_seq, last_stream_seq) of each segment of a run, in order."""
        rows = await self._fetch("segment_ranges", uuid.UUID(run_id))
        return [(r["first_seq"], r["last_seq"], r["last_stream_seq"]) for r in rows]

    async def mark_frames_closed(self, run_id: str) -> None:
        await self._fetch("mark_frames_closed", uuid.UUID(run_id))

    async def archived_through(self, stream: str) -> tuple[str, int] | None:
        """When the frames stream `stream` archived was made, and how far it is
        archived; None before it ever was."""
        row = await self._fetchrow("archived_through", stream)
        return (row["stream_created"], int(row["archived_through"])) if row else None

    async def advance_archive(self, stream: str, created: str, through: int) -> None:
        """Every frame of `stream` (the one made at `created`) up to stream sequence
        `through` is archived."""
        await self._fetch("advance_archive", stream, created, through)

    async def restart_archive(self, stream: str, created: str, through: int) -> None:
        """Archive `stream`, the one made at `created`, from after `through`."""
        await self._fetch("restart_archive", stream, created, through)

    async def insert_segments(self, segments: Sequence[Segment]) -> list[SegmentCount]:
        """Write one flush: a segment per run and the runs' counters, in one statement.

        Returns each touched run's counters, so a closed run missing frames is noticed.
        """
        if not segments:
            return []
        rows = await self._fetch(
            "insert_segments",
            [uuid.UUID(s.run_id) for s in segments],
            [s.first_seq for s in segments],
            [s.last_seq for s in segments],
            [s.last_stream_seq for s in segments],
            ["[" + ",".join(s.frames) + "]" for s in segments],
            [s.closed for s in segments],
        )
        return [
            SegmentCount(
                str(r["run_id"]), r["tenant"], r["last_seq"], r["frame_count"], r["done_written"]
            )
            for r in rows
        ]
