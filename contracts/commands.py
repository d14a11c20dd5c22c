"""Command bodies, sent request/reply on `<prefix>.<tenant>.cmd.<name>`.

The tenant is taken from the subject, never from the body. Numbers are JSON numbers:
`"3"` (or `true`, or `3.0`) is refused where an integer is expected, as the published
schema says.
"""

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import AwareDatetime, Field, StringConstraints, field_validator, model_validator

from runwire.contracts.base import Versioned
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import (
    EFFECT_KIND_PATTERN,
    RUNNER_NAME_PATTERN,
    SIGNAL_NAME_PATTERN,
)
from runwire.contracts.webhooks import MAX_ENDPOINTS, WebhookEndpoint
from runwire.contracts.workflows import (
    MAX_VERSION,
    RELEASE_ID_PATTERN,
    WorkflowDefinition,
    WorkflowRef,
)

MAX_ID_LENGTH = 200
# A signal's name: what a runner's `ctx.wait_for_signal(name)` waits for.
# The largest integer every JSON client holds exactly (2^53 - 1): the most a budget (tokens
# or cost units) or a frame cursor may be. Integers are checked before they reach SQL.
MAX_SAFE_INTEGER = 2**53 - 1
MAX_BUDGET = MAX_SAFE_INTEGER
MAX_SEQ = MAX_SAFE_INTEGER
EffectKind = Annotated[str, StringConstraints(pattern=EFFECT_KIND_PATTERN)]


# A rate limit's name: a model provider's key, or `<key>:<model>`.
RATE_LIMIT_KEY_PATTERN = r"^[A-Za-z0-9_.:/-]{1,200}$"
# A schedule's name; how far back a schedule catches up after an outage (a day).
SCHEDULE_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
MAX_CATCH_UP_S = 86_400
# How far ahead a run may be delayed: 30 days; how long a coalesced run may wait for more.
MAX_COALESCE_MS = 600_000
MAX_DELAY_MS = 30 * 86_400_000
# A run's priority at submit: a small integer, higher first.
MIN_PRIORITY = -10
MAX_PRIORITY = 10


class Command(Versioned):
    """A command's body."""

    @field_validator("v", mode="before")
    @classmethod
    def _integer_version(cls, value: Any) -> Any:
        # `true` and `1.0` equal 1 in Python; on the wire the version is the integer 1.
        if type(value) is not int:
            raise ValueError("v must be the integer 1")
        return value


class Multitask(StrEnum):
    """What a new run does when its session already has an active run."""

    INTERRUPT = "interrupt"
    ENQUEUE = "enqueue"
    REJECT = "reject"
    # Runs queued behind the busy session merge into one next run: the first creates it,
    # with input `{"inputs": [its input]}`; each later one, until that run starts, adds
    # its input to `inputs` and is answered with that run (`coalesced`). `coalesce_ms`:
    # how long the new run waits for more even when the session is not busy.
    COALESCE = "coalesce"


class SubmitCommand(Command):
    """Start a run. `request_id` is the idempotency key within the tenant."""

    request_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    # The runner's input; for a workflow run, `workflow.input` instead.
    input: dict[str, Any] = Field(default_factory=dict)
    runner: str = Field(default="scripted", pattern=RUNNER_NAME_PATTERN)
    # Run a release's graph of nodes instead of one runner (see contracts.workflows).
    workflow: WorkflowRef | None = None
    session_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    multitask: Multitask = Multitask.INTERRUPT
    max_attempts: int | None = Field(default=None, ge=1, le=100, strict=True)
    attempt_timeout_ms: int | None = Field(default=None, ge=100, le=86_400_000, strict=True)
    queue_timeout_ms: int | None = Field(default=None, ge=100, le=86_400_000, strict=True)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Tokens the run may spend over all its attempts (model calls reserve, then settle).
    budget_tokens: int | None = Field(default=None, ge=1, le=MAX_BUDGET, strict=True)
    # Cost units the run may spend (an amount the tenant defines; costly effects and
    # model calls priced in it reserve, then settle).
    budget_cost: int | None = Field(default=None, ge=1, le=MAX_BUDGET, strict=True)
    # The effect kinds the run may perform (`ctx.effect`); None: every kind its tenant's
    # policy allows (none until an operator sets one). Taken into the run's authorization
    # at submit: a claim made after the tenant's policy changed fails with
    # AUTHORIZATION_STALE.
    effects: list[EffectKind] | None = Field(default=None, max_length=64)
    # Among its tenant's runs waiting for their share of executor slots, higher first (a
    # run that waited longer than the stack's `priority_max_wait_ms` goes first anyway).
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True)
    # Runs of one key (a user id, say) hold at most the tenant's `max_runs_per_key` jobs at
    # once (an operator's `set_budget`); the rest wait, whatever executor is free.
    concurrency_key: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    # A delayed run: it starts no earlier than `delay_ms` after its submit, or than
    # `not_before` (one or the other). It waits without a job, holding no share of its
    # tenant's executor slots; `cancel` and `reschedule` act on it meanwhile.
    delay_ms: int | None = Field(default=None, ge=1, le=MAX_DELAY_MS, strict=True)
    not_before: AwareDatetime | None = None
    # multitask `coalesce`: the longest a new run waits for more inputs to join it.
    coalesce_ms: int | None = Field(default=None, ge=1, le=MAX_COALESCE_MS, strict=True)

    @model_validator(mode="after")
    def _one_start_time(self) -> Self:
        if self.delay_ms is not None and self.not_before is not None:
            raise ValueError("give delay_ms or not_before, not both")
        if self.multitask == Multitask.COALESCE:
            if self.session_id is None or self.workflow is not None:
                raise ValueError("multitask coalesce is for runs of a session, not workflows")
            if self.delay_ms is not None or self.not_before is not None:
                raise ValueError("a coalesced run starts after coalesce_ms, not a delay")
        elif self.coalesce_ms is not None:
            raise ValueError("coalesce_ms goes with multitask coalesce")
        return self

    @model_validator(mode="after")
    def _runner_or_workflow(self) -> Self:
        if self.workflow is not None and ({"runner", "input"} & self.model_fields_set):
            raise ValueError(
                "a workflow run takes its input in workflow.input and its runners from its "
                "release: give neither runner nor input"
            )
        if self.workflow is None and "input" not in self.model_fields_set:
            raise ValueError("input is required (or workflow, for a workflow run)")
        return self


class ReleaseCommand(Command):
    """Publish a release: `definition` under `release_id` and `version`, for good.
    Publishing the same id and version again with the same definition answers with the
    release (`created: false`); with another definition it is refused."""

    release_id: str = Field(pattern=RELEASE_ID_PATTERN)
    version: int = Field(ge=1, le=MAX_VERSION, strict=True)
    definition: WorkflowDefinition


class CancelCommand(Command):
    """Cancel a run. Cancelling a terminal run answers with the run unchanged."""

    run_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)


class GetCommand(Command):
    """Read a run's summary."""

    run_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)


class ListCommand(Command):
    """The tenant's runs, newest first, `limit` at a time: those of `status`, `runner`
    and `session_id` when given, submitted at or after `created_after` and before
    `created_before` (RFC 3339 with a time zone) when given (a workflow's node runs are
    not listed, their workflow run is). `before`: the `next` of the page before, for the
    page after it."""

    status: RunStatus | None = None
    runner: str | None = Field(default=None, pattern=RUNNER_NAME_PATTERN)
    session_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    created_after: AwareDatetime | None = None
    created_before: AwareDatetime | None = None
    limit: int = Field(default=50, ge=1, le=500, strict=True)
    before: int | None = Field(default=None, ge=1, le=MAX_SEQ, strict=True)

    @field_validator("created_after", "created_before")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        # A time that is no time in UTC (year 1 at +14:00) is no time Postgres can take.
        try:
            return value.astimezone(UTC) if value is not None else None
        except OverflowError:
            raise ValueError("the time is out of range in UTC") from None

    @model_validator(mode="after")
    def _a_time_range(self) -> Self:
        if (
            self.created_after is not None
            and self.created_before is not None
            and self.created_after >= self.created_before
        ):
            raise ValueError("created_after must be earlier than created_before")
        return self


class ResolveEffectCommand(Command):
    """An operator settles a side effect whose outcome runwire could not know (`unknown`,
    `claimed` by an attempt that is gone, or `failed` with EFFECT_DEADLINE_EXCEEDED: it
    may have happened): with the receipt of the action that happened (`reconciled`, its
    reservation charged), or with why it did not (`failed`, its reservation released).
    Exactly one of the two."""

    run_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    key: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    receipt: dict[str, Any] | None = None
    error: str | None = Field(default=None, min_length=1, max_length=2000)

    @model_validator(mode="after")
    def _one_outcome(self) -> Self:
        if (self.receipt is None) == (self.error is None):
            raise ValueError("give exactly one of receipt (it happened) or error (it did not)")
        return self


class SetBudgetCommand(Command):
    """Set the tenant's limits; a field left out keeps its value, `null` removes it.
    `tokens` and `cost` (units the tenant defines): the budgets (runs keep what they
    reserved; a new reservation must fit); `max_active_runs` and `max_runs_per_day`
    (UTC): quotas answered at submit. `share`: the tenant's weight in the fair share of
    executor slots among busy tenants (null: 1); `max_queued_runs`: how many of its runs
    may wait for an attempt before its submits fail `QUEUE_FULL` (null: the stack's
    default); `max_runs_per_key`: how many runs of one `concurrency_key` may hold a job
    (queued for an executor or running) at once (null: no limit)."""

    tokens: int | None = Field(default=None, ge=0, le=MAX_BUDGET, strict=True)
    cost: int | None = Field(default=None, ge=0, le=MAX_BUDGET, strict=True)
    max_active_runs: int | None = Field(default=None, ge=0, le=2**31 - 1, strict=True)
    max_runs_per_day: int | None = Field(default=None, ge=0, le=2**31 - 1, strict=True)
    share: int | None = Field(default=None, ge=1, le=1000, strict=True)
    max_queued_runs: int | None = Field(default=None, ge=0, le=2**31 - 1, strict=True)
    max_runs_per_key: int | None = Field(default=None, ge=1, le=2**31 - 1, strict=True)


class GetBudgetCommand(Command):
    """Read the tenant's budget and what its runs spent and hold reserved."""


class SetPolicyCommand(Command):
    """Set the tenant's policy: `effects`, the effect kinds its runs may perform (null:
    every kind; a tenant whose policy was never set may perform none). An operator's
    command, not a tenant's. Every run submitted before holds a stale authorization from
    now on: its next effect claim fails with AUTHORIZATION_STALE (effects already
    dispatched are not undone)."""

    effects: list[EffectKind] | None = Field(max_length=64)


class GetPolicyCommand(Command):
    """Read the tenant's policy."""


class AbortSessionCommand(Command):
    """Cancel every active and queued run of a session."""

    session_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)


class EndTenantCommand(Command):
    """Cancel every active and queued run of the tenant (an operator's command, not a
    tenant's: what `runwire tenant remove` sends once the tenant's identity is revoked)."""


class ForgetTenantCommand(Command):
    """Delete what runwire keeps of a removed tenant: its runs (with their frames,
    attempts, events, effects and budget reservations), workflow releases, budget, spend
    and policy, so that a tenant given its name later inherits nothing. While a run of the
    tenant is still active (or has just ended, its last frames not stored yet), nothing
    is deleted and the reply says how many are (cancel them with `end_tenant` first). An
    operator's command, as `end_tenant`."""


class RescheduleCommand(Command):
    """Move a delayed run's start: to `delay_ms` from now, or to `not_before` (one or the
    other; a time past starts it as soon as its tenant's share has room). Only a run that
    waits without a job (delayed, or queued behind its session, key or share) can be
    rescheduled: NOT_RESCHEDULABLE when it has its job already (it started, or is about
    to), or has ended."""

    run_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    delay_ms: int | None = Field(default=None, ge=0, le=MAX_DELAY_MS, strict=True)
    not_before: AwareDatetime | None = None

    @model_validator(mode="after")
    def _one_start_time(self) -> Self:
        if (self.delay_ms is None) == (self.not_before is None):
            raise ValueError("give delay_ms or not_before (one of them)")
        return self


class SetWebhooksCommand(Command):
    """Replace the tenant's webhook endpoints (an empty list: none). The first call, or
    one with `rotate_secret`, makes the secret deliveries are signed with and answers it
    once (`secret`); deliveries signed with the previous one may still arrive."""

    endpoints: list[WebhookEndpoint] = Field(max_length=MAX_ENDPOINTS)
    rotate_secret: bool = False

    @field_validator("endpoints")
    @classmethod
    def _one_each(cls, endpoints: list[WebhookEndpoint]) -> list[WebhookEndpoint]:
        urls = [e.url for e in endpoints]
        if len(set(urls)) != len(urls):
            raise ValueError("each url once")
        return endpoints


class Overlap(StrEnum):
    """What a schedule's fire does while a run of the schedule is still active."""

    SKIP = "skip"  # no run for this fire
    BUFFER = "buffer"  # a run that starts when the ones before it have ended
    ALLOW = "allow"  # a run beside it


class SetScheduleCommand(Command):
    """Create or replace the schedule `name`: a run of `runner` on `input` at each time
    the cron expression `cron` (five fields, or six with seconds first) names in time zone
    `tz`, each fire once. `overlap`: see Overlap. `catch_up_s`: after an outage, the fires
    missed within this many seconds still run (the latest missed one always does).
    `paused`: no fire until set again without it (missed fires are not made up)."""

    name: str = Field(pattern=SCHEDULE_NAME_PATTERN)
    cron: str = Field(min_length=9, max_length=200)
    tz: str = Field(default="UTC", min_length=1, max_length=64)
    runner: str = Field(default="scripted", pattern=RUNNER_NAME_PATTERN)
    input: dict[str, Any] = Field(default_factory=dict)
    overlap: Overlap = Overlap.SKIP
    catch_up_s: int = Field(default=0, ge=0, le=MAX_CATCH_UP_S, strict=True)
    paused: bool = False


class RemoveScheduleCommand(Command):
    """Remove the schedule `name` (its runs made already go on)."""

    name: str = Field(pattern=SCHEDULE_NAME_PATTERN)


class ListSchedulesCommand(Command):
    """The tenant's schedules."""


class BackfillScheduleCommand(Command):
    """Make the runs of schedule `name`'s fires from `start` to `end` (both included, at
    most 1,000 fires, none in the future), each once: a fire made before (by the schedule
    or an earlier backfill) makes nothing. Its overlap policy holds."""

    name: str = Field(pattern=SCHEDULE_NAME_PATTERN)
    start: AwareDatetime
    end: AwareDatetime


class SetRateLimitCommand(Command):
    """An operator's rate limit of a model provider's key or of one of its models
    (`openai`, `openai:gpt-4o`), shared by every tenant and executor: at most `rpm`
    requests and `tpm` tokens (prompt and answer) in any minute (null: no limit in that
    unit). Each model call takes room under the limits of its provider key and its model
    before it is made; a call without room waits, its run queued without a slot. Both
    null: the limit is removed. An operator's command, not a tenant's."""

    key: str = Field(pattern=RATE_LIMIT_KEY_PATTERN)
    rpm: int | None = Field(default=None, ge=1, le=2**31 - 1, strict=True)
    tpm: int | None = Field(default=None, ge=1, le=2**31 - 1, strict=True)


class GetRateLimitsCommand(Command):
    """Read the rate limits, what each holds of the last minute and the runs waiting."""


class GetWebhooksCommand(Command):
    """Read the tenant's webhook endpoints, the deliveries still to make and those that
    failed for good."""


class ResumeCommand(Command):
    """Answer the interrupt a waiting run waits for with `value` (any JSON): its next
    attempt is queued at once, and the runner's `ctx.interrupt` returns the value.
    `wait_id` (from the `wait` frame or `get`'s `waiting_for`) makes sure the answer is to
    that question. `request_id`: the same twice is one answer (`duplicate`). NOT_WAITING
    when the run does not wait for an interrupt (or not that one)."""

    request_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    run_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    wait_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    value: Any = None


class SignalCommand(Command):
    """Send the signal `name` with `payload` to a run: a wait of the run for that name
    takes it (its next attempt is queued at once), now or, kept in the run's mailbox in
    order, when the runner waits for it. `request_id`: the same twice is one signal."""

    request_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    run_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    name: str = Field(pattern=SIGNAL_NAME_PATTERN)
    payload: Any = None


class JoinCommand(Command):
    """Join a run's frames: every frame with `seq > after`, then live."""

    run_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    after: int = Field(default=0, ge=0, le=MAX_SEQ, strict=True)


# The body of each command, by the name in its subject (subjects.COMMANDS).
BODIES: dict[str, type[Command]] = {
    "submit": SubmitCommand,
    "release": ReleaseCommand,
    "cancel": CancelCommand,
    "get": GetCommand,
    "abort_session": AbortSessionCommand,
    "end_tenant": EndTenantCommand,
    "forget_tenant": ForgetTenantCommand,
    "list": ListCommand,
    "resume": ResumeCommand,
    "signal": SignalCommand,
    "reschedule": RescheduleCommand,
    "set_schedule": SetScheduleCommand,
    "remove_schedule": RemoveScheduleCommand,
    "list_schedules": ListSchedulesCommand,
    "backfill_schedule": BackfillScheduleCommand,
    "set_webhooks": SetWebhooksCommand,
    "get_webhooks": GetWebhooksCommand,
    "resolve_effect": ResolveEffectCommand,
    "set_budget": SetBudgetCommand,
    "get_budget": GetBudgetCommand,
    "set_policy": SetPolicyCommand,
    "get_policy": GetPolicyCommand,
    "set_rate_limit": SetRateLimitCommand,
    "get_rate_limits": GetRateLimitsCommand,
    "join": JoinCommand,
}
