"""Runs that wait: an attempt's waits, the answers and signals that decide them, and
their timeouts (`sql/functions/waits.sql`)."""

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from runwire.contracts.errors import ErrorBody
from runwire.runtime.errors import CANCELED_ERROR
from runwire.runtime.store.queries import Queries
from runwire.runtime.store.rows import Run


class WaitState(StrEnum):
    """Where a wait stands for the attempt that begins it."""

    ANSWERED = "answered"
    TIMED_OUT = "timed_out"
    WAITING = "waiting"  # the attempt ends to wait
    LOST = "lost"  # the attempt no longer owns the run


@dataclass(frozen=True, slots=True)
class WaitBegun:
    state: WaitState
    value: Any
    timeout_at: datetime | None
    # How long it lasted, to the first attempt that finds it decided; else None.
    waited_s: float | None = None


class Answer(StrEnum):
    """What became of a `resume` or a `signal`."""

    RESUMED = "resumed"
    DELIVERED = "delivered"
    KEPT = "kept"
    DUPLICATE = "duplicate"
    # Past the wait's timeout, not yet timed out by recovery: refused as NOT_WAITING.
    TIMED_OUT = "timed_out"
    NOT_WAITING = "not_waiting"
    NOT_FOUND = "not_found"


class WaitQueries(Queries):
    """A run's waits, as the executor, the submitter and recovery see them."""

    async def wait_begin(
        self,
        run_id: str,
        generation: int,
        wait_id: str,
        *,
        kind: str,
        name: str | None,
        payload: Any,
        timeout_ms: int | None,
    ) -> WaitBegun:
        rec = await self._fetchrow(
            "wait_begin", uuid.UUID(run_id), generation, wait_id, kind, name, payload, timeout_ms
        )
        assert rec is not None
        return WaitBegun(WaitState(rec["state"]), rec["value"], rec["timeout_at"], rec["waited_s"])

    async def enter_waiting(
        self,
        run_id: str,
        generation: int,
        wait_id: str,
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
        cancel_error: ErrorBody = CANCELED_ERROR,
    ) -> Run:
        """The attempt ends to wait for `wait_id` (see enter_waiting in waits.sql)."""
        return await self._transition(
            "enter_waiting",
            run_id,
            generation,
            wait_id,
            partial_text,
            actor,
            close_seq,
            trace_parent_of_implied,
            cancel_error.model_dump(mode="json"),
        )

    async def resume_run(
        self,
        tenant: str,
        run_id: str,
        wait_id: str | None,
        value: Any,
        request_id: str,
        actor: str,
    ) -> tuple[Answer, str | None]:
        """Answer the run's interrupt; (what became of it, the transaction's id)."""
        rec = await self._fetchrow(
            "resume_run", tenant, uuid.UUID(run_id), wait_id, value, request_id, actor
        )
        assert rec is not None
        return Answer(rec["result"]), rec["xact"]

    async def signal_run(
        self, tenant: str, run_id: str, name: str, payload: Any, request_id: str, actor: str
    ) -> tuple[Answer, str | None]:
        """Send the run a signal; (what became of it, the transaction's id)."""
        rec = await self._fetchrow(
            "signal_run", tenant, uuid.UUID(run_id), name, payload, request_id, actor
        )
        assert rec is not None
        return Answer(rec["result"]), rec["xact"]

    async def deliver_kept_signal(
        self, tenant: str, run_id: str, actor: str
    ) -> tuple[str, str | None]:
        """Hand a signal kept by workflow run `run_id` to a node run that waits for it:
        ('delivered' | 'again' | 'none', the transaction's id)."""
        rec = await self._fetchrow("deliver_kept_signal", tenant, uuid.UUID(run_id), actor)
        assert rec is not None
        return rec["result"], rec["xact"]

    async def waiting_for(self, run_id: str) -> dict[str, Any] | None:
        """The wait a run waits for (not decided yet), or None."""
        rec = await self._fetchrow("waiting_for", uuid.UUID(run_id))
        return dict(rec) if rec is not None else None

    async def list_runs(
        self,
        tenant: str,
        *,
        status: str | None,
        runner: str | None,
        session_id: str | None,
        before: int | None,
        limit: int,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
    ) -> list[tuple[Run, dict[str, Any] | None]]:
        """A page of the tenant's runs, newest first, each with the wait it waits for
        (a waiting run's); created in [`created_after`, `created_before`) when given."""
        rows = await self._fetch(
            "list_runs",
            tenant,
            status,
            runner,
            session_id,
            before,
            limit,
            created_after,
            created_before,
        )
        return [
            (
                Run.from_record(r),
                {
                    "wait_id": r["wait_id"],
                    "kind": r["wait_kind"],
                    "name": r["wait_name"],
                    "payload": r["wait_payload"],
                    "timeout_at": r["wait_timeout_at"],
                }
                if r["wait_id"] is not None
                else None,
            )
            for r in rows
        ]

    async def time_out_waits(self, limit: int, actor: str) -> list[Run]:
        """Decide the waits past their timeout; the waiting runs woken by it."""
        return [Run.from_record(r) for r in await self._fetch("time_out_waits", limit, actor)]
