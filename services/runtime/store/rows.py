"""Rows as the services use them: a run, frame segments, outbox messages to publish."""

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import asyncpg

from runwire.contracts.errors import ErrorBody
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.contracts.workflows import ReleaseRef


def parse_run_id(run_id: str) -> uuid.UUID | None:
    """A run id is a UUID; anything else names no run."""
    try:
        return uuid.UUID(run_id)
    except ValueError:
        return None


def _error(stored: dict[str, Any] | None) -> ErrorBody | None:
    """An error column (`{code, message, retryable}` as JSON) as the wire's model."""
    return ErrorBody.model_validate(stored) if stored else None


@dataclass(frozen=True, slots=True)
class Run:
    """A row of `runs`, as the services use it."""

    run_id: str
    tenant: str
    request_id: str
    session_id: str | None
    multitask: str
    runner: str
    input: dict[str, Any]
    metadata: dict[str, Any]
    status: RunStatus
    attempts: int
    max_attempts: int
    generation: int
    attempt_timeout_ms: int
    queue_timeout_ms: int | None
    not_before: datetime
    cancel_requested: bool
    partial_text: str
    checkpoint: Any
    checkpoint_version: int
    recoveries: int
    last_seq: int
    frame_count: int
    frames_closed: bool
    frames_expired: bool
    job_ack: str | None
    result: dict[str, Any] | None
    error: ErrorBody | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    updated_at: datetime
    # NULL while the run waits for its session (no job published yet).
    job_published_at: datetime | None
    # Order of acceptance: within a session, the order in which its runs start.
    submit_seq: int
    # The error a requested cancel closes the run with (CANCELED, SUPERSEDED).
    cancel_error: ErrorBody | None
    # The run's trace (W3C traceparent), set at submit.
    trace_parent: str | None = None
    # When recovery last checked that the run's job is still in the stream.
    job_checked_at: datetime | None = None
    # The fingerprint of the configuration its attempts must run with (see RunnerSpec.pin).
    config_pin: str | None = None
    # A workflow run: its release ({release_id, version}).
    workflow: dict[str, Any] | None = None
    # A node run: its workflow run, its node, its node's backoff (None: the executor's).
    parent_run_id: str | None = None
    node_id: str | None = None
    retry_base_ms: int | None = None
    # Set by a claim: how many frames the attempt before published, its closing `error`
    # frame included (None when it closed with none of its own: the resumed attempt's cut
    # waits for them, see runwire.executor.resume).
    prev_close_seq: int | None = None
    # Its attempts that ended to wait (not counted against max_attempts).
    waits: int = 0
    # Its priority among its tenant's waiting runs, and its concurrency key.
    priority: int = 0
    concurrency_key: str | None = None
    # A queued run whose model call waits for room under this rate limit.
    limit_key: str | None = None
    # The transaction of the transition that returned this row: what it implies waits in
    # the outbox under this id, for the service to publish (None for a plain read).
    xact: str | None = None
    # What that transition implies that was due at once, when its statement returned it
    # (a submit's job, a finish's `done`): published as they are. None: looked up in the
    # outbox by `xact`.
    messages: "list[OutboxMessage] | None" = field(default=None, repr=False)

    @classmethod
    def from_record(
        cls, rec: asyncpg.Record, messages: "list[OutboxMessage] | None" = None
    ) -> "Run":
        return cls(
            run_id=str(rec["run_id"]),
            tenant=rec["tenant"],
            request_id=rec["request_id"],
            session_id=rec["session_id"],
            multitask=rec["multitask"],
            runner=rec["runner"],
            input=rec["input"],
            metadata=rec["metadata"],
            status=RunStatus(rec["status"]),
            attempts=rec["attempts"],
            max_attempts=rec["max_attempts"],
            generation=rec["generation"],
            attempt_timeout_ms=rec["attempt_timeout_ms"],
            queue_timeout_ms=rec["queue_timeout_ms"],
            not_before=rec["not_before"],
            cancel_requested=rec["cancel_requested"],
            partial_text=rec["partial_text"],
            checkpoint=rec["checkpoint"],
            checkpoint_version=rec["checkpoint_version"],
            recoveries=rec["recoveries"],
            last_seq=rec["last_seq"],
            frame_count=rec["frame_count"],
            frames_closed=rec["frames_closed"],
            frames_expired=rec["frames_expired_at"] is not None,
            job_ack=rec["job_ack"],
            result=rec["result"],
            error=_error(rec["error"]),
            created_at=rec["created_at"],
            started_at=rec["started_at"],
            ended_at=rec["ended_at"],
            updated_at=rec["updated_at"],
            job_published_at=rec["job_published_at"],
            submit_seq=rec["submit_seq"],
            cancel_error=_error(rec["cancel_error"]),
            trace_parent=rec["trace_parent"],
            job_checked_at=rec["job_checked_at"],
            config_pin=rec.get("config_pin"),
            workflow=rec.get("workflow"),
            parent_run_id=str(rec["parent_run_id"]) if rec.get("parent_run_id") else None,
            node_id=rec.get("node_id"),
            retry_base_ms=rec.get("retry_base_ms"),
            prev_close_seq=rec.get("prev_close_seq"),
            waits=rec.get("waits") or 0,
            priority=rec.get("priority") or 0,
            concurrency_key=rec.get("concurrency_key"),
            limit_key=rec.get("limit_key"),
            xact=rec.get("xact"),
            messages=messages,
        )

    def summary(self) -> RunSummary:
        """The run as the wire contract shows it."""
        return RunSummary(
            run_id=self.run_id,
            tenant=self.tenant,
            session_id=self.session_id,
            request_id=self.request_id,
            runner=self.runner,
            status=self.status,
            attempts=self.attempts,
            generation=self.generation,
            created_at=self.created_at,
            started_at=self.started_at,
            ended_at=self.ended_at,
            updated_at=self.updated_at,
            last_seq=self.last_seq,
            frames_complete=self.frames_closed,
            result=self.result,
            error=self.error,
            workflow=ReleaseRef.model_validate(self.workflow) if self.workflow else None,
            parent_run_id=self.parent_run_id,
            node_id=self.node_id,
            priority=self.priority,
            concurrency_key=self.concurrency_key,
            # A delayed run, or a retry's backoff (a run's own start time is its submit's).
            not_before=self.not_before
            if self.status == RunStatus.QUEUED and self.not_before > self.created_at
            else None,
        )


@dataclass(frozen=True, slots=True)
class Segment:
    """Frames of one run written by one relay flush, in seq order, each as its JSON text
    (the same bytes that were published, so nothing is serialized twice)."""

    run_id: str
    first_seq: int
    last_seq: int
    last_stream_seq: int
    frames: list[str]
    closed: bool


class OutboxKind(StrEnum):
    """Where an outbox message goes; the Postgres enum `outbox_kind` mirrors it."""

    JOB = "job"
    FRAME = "frame"
    EVENT = "event"


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """A message a committed transition implies: `kind` says where it goes, `msg_id` is
    its `Nats-Msg-Id`, `body` its JSON text; `id` is its outbox row's (its run_events
    row's for an event)."""

    id: int
    kind: OutboxKind
    tenant: str
    run_id: str
    msg_id: str
    body: str
    trace_parent: str | None
    # A job's runner (its subject carries it); None for frames and events.
    runner: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "OutboxMessage":
        """A message as a statement returned it in a JSON array (`xact_messages`)."""
        return cls(
            int(data["id"]),
            OutboxKind(data["kind"]),
            data["tenant"],
            str(data["run_id"]),
            data["msg_id"],
            data["body"],
            data["trace_parent"],
            data.get("runner"),
        )

    @classmethod
    def from_record(cls, rec: asyncpg.Record) -> "OutboxMessage":
        return cls(
            rec["id"],
            OutboxKind(rec["kind"]),
            rec["tenant"],
            str(rec["run_id"]),
            rec["msg_id"],
            rec["body"],
            rec["trace_parent"],
            rec.get("runner"),
        )


@dataclass
class OutboxBatch:
    """Messages taken by the sweep (outbox rows and run events), and those published
    (done when the sweep's transaction commits)."""

    messages: list[OutboxMessage]
    published: list[OutboxMessage] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SegmentCount:
    """A run's frame counters after a flush: complete when frame_count == last_seq.

    `closed` says the flush wrote the run's `done`."""

    run_id: str
    tenant: str
    last_seq: int
    frame_count: int
    closed: bool


@dataclass(frozen=True, slots=True)
class SegmentText:
    """A stored segment with its frames as the JSON text of an array."""

    first_seq: int
    last_seq: int
    last_stream_seq: int
    frames: str


@dataclass(frozen=True, slots=True)
class StoredSegment:
    first_seq: int
    last_seq: int
    last_stream_seq: int
    frames: list[dict[str, Any]]
    # Bytes of its frames as JSON text (about what they take in a reply).
    size: int = 0


@dataclass(frozen=True)
class Effect:
    """A row of `effects`: one side effect of a run and where it stands."""

    run_id: str
    key: str
    kind: str
    idempotency_key: str
    request: dict[str, Any]
    request_digest: str
    state: str
    version: int
    fence: int
    claimed_generation: int | None
    receipt: dict[str, Any] | None
    error: str | None
    error_code: str | None = None
    # Its claim's deadline has passed (as of the read).
    past_deadline: bool = False
    # The budget it reserved when it was prepared (reservation `effect:<key>`).
    tokens: int = 0
    cost: int = 0

    @classmethod
    def from_record(cls, rec: asyncpg.Record) -> "Effect":
        return cls(
            run_id=str(rec["run_id"]),
            key=rec["key"],
            kind=rec["kind"],
            idempotency_key=rec["idempotency_key"],
            request=rec["request"],
            request_digest=rec["request_digest"],
            state=str(rec["state"]),
            version=rec["version"],
            fence=rec["fence"],
            claimed_generation=rec["claimed_generation"],
            receipt=rec["receipt"],
            error=rec["error"],
            error_code=rec["error_code"],
            past_deadline=bool(rec.get("past_deadline")),
            tokens=rec.get("tokens") or 0,
            cost=rec.get("cost") or 0,
        )


@dataclass(frozen=True, slots=True)
class BudgetGrant:
    """The answer to a reservation: granted or not, and what is left of each limit
    (None: no such limit)."""

    granted: bool
    tenant_tokens_left: int | None = None
    run_tokens_left: int | None = None
    tenant_cost_left: int | None = None
    run_cost_left: int | None = None

    @classmethod
    def from_record(cls, rec: asyncpg.Record) -> "BudgetGrant":
        return cls(
            granted=bool(rec["granted"]),
            tenant_tokens_left=rec["tenant_left"],
            run_tokens_left=rec["run_left"],
            tenant_cost_left=rec["tenant_cost_left"],
            run_cost_left=rec["run_cost_left"],
        )

    def shortfall(self) -> str:
        """What is left, of the limits that have one, for an error message."""
        parts = [
            f"{who} has {n} {unit} left"
            for who, unit, n in (
                ("the tenant", "tokens", self.tenant_tokens_left),
                ("the run", "tokens", self.run_tokens_left),
                ("the tenant", "cost units", self.tenant_cost_left),
                ("the run", "cost units", self.run_cost_left),
            )
            if n is not None
        ]
        return ", ".join(parts) or "no limit applies"


def runs_told(records: list[asyncpg.Record]) -> list[Run]:
    """The runs a statement that also tells its messages returned (`submit_runs`,
    `finish_runs_told`: the runs' rows, then one row without a run that holds the
    messages), each with the messages that are its own; a message of another run (the
    job of the next run of a session) goes with the first run, so that it is published
    all the same."""
    rows = [rec for rec in records if rec["run_id"] is not None]
    of_run: dict[str, list[OutboxMessage]] = {str(rec["run_id"]): [] for rec in rows}
    for rec in records:
        if rec["run_id"] is None and rows:
            first = of_run[str(rows[0]["run_id"])]
            for data in rec["messages"] or []:
                message = OutboxMessage.from_json(data)
                of_run.get(message.run_id, first).append(message)
    return [Run.from_record(rec, of_run[str(rec["run_id"])]) for rec in rows]
