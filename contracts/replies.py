"""Successful command replies and the run summary they carry."""

from typing import Any, Literal

from pydantic import AwareDatetime, Field

from runwire.contracts.base import Versioned, WireModel
from runwire.contracts.errors import ErrorBody
from runwire.contracts.frames import EffectData, Frame, WaitData
from runwire.contracts.status import RunStatus
from runwire.contracts.webhooks import WebhookEndpoint, WebhookFailure
from runwire.contracts.workflows import NodeRunData, ReleaseRef


class RunBudget(WireModel):
    """A run's budget and its spending: its limits in tokens and in cost units (None: no
    limit of its own), what its costly calls used (settled) and what they hold reserved
    now, and how many such calls it made."""

    tokens: int | None = None
    tokens_used: int = 0
    tokens_reserved: int = 0
    cost: int | None = None
    cost_used: int = 0
    cost_reserved: int = 0
    calls: int = 0


class RunSummary(WireModel):
    """A run as clients see it. Times are RFC 3339 in UTC."""

    run_id: str
    tenant: str
    session_id: str | None
    request_id: str
    # The runner of its attempts (`workflow` for a workflow run; absent from replies of
    # a runwire before it was given).
    runner: str | None = None
    status: RunStatus
    attempts: int
    generation: int
    created_at: AwareDatetime
    started_at: AwareDatetime | None
    ended_at: AwareDatetime | None
    updated_at: AwareDatetime
    # The seq of the last frame stored in Postgres. The relay writes frames there a few
    # milliseconds after it publishes them, so a client reading the run's stream may see
    # later frames than this; once `frames_complete` is true, `last_seq` is final: the
    # seq of the run's `done` frame, with every frame before it stored.
    last_seq: int
    frames_complete: bool = False
    result: dict[str, Any] | None = None
    error: ErrorBody | None = None
    # The run's side effects and where each stands (in `get` and `resolve_effect`
    # replies; empty elsewhere).
    effects: list[EffectData] = Field(default_factory=list)
    # A workflow run: its release, and (in `get` replies) its node runs.
    workflow: ReleaseRef | None = None
    nodes: list[NodeRunData] = Field(default_factory=list)
    # A node run: its workflow run, and the node it runs.
    parent_run_id: str | None = None
    node_id: str | None = None
    # A waiting run: what it waits for (the data of its `wait` frame).
    waiting_for: WaitData | None = None
    # Its budget and what it spent (in `get` replies; absent elsewhere).
    budget: RunBudget | None = None
    # Its priority and concurrency key, as submitted.
    priority: int = 0
    concurrency_key: str | None = None
    # A queued run without a job yet (in `get` replies): what it waits for, `time` (it is
    # delayed until `not_before`), `session` (an earlier run of its session is active),
    # `concurrency_key` (its key's runs hold the tenant's limit), `share` (its tenant's
    # runs hold its share of executor slots) or `rate_limit` (its model call waits for
    # room under `limit_key`, a rate limit, until `not_before` at the latest).
    queued_for: str | None = None
    limit_key: str | None = None
    # A queued run that may not start before this time (a delayed run, or a retry's
    # backoff); absent otherwise.
    not_before: AwareDatetime | None = None


class FrameChannel(WireModel):
    """Where a run's frames are published: the JetStream stream and the run's subject."""

    stream: str
    subject: str


class SubmitReply(Versioned):
    """The run a submit created, or the first run of that `request_id`, and where its
    frames are published (read them with `join`, or from the stream directly)."""

    ok: Literal[True] = True
    run: RunSummary
    duplicate: bool
    frames: FrameChannel
    # multitask `coalesce`: this submit's input joined `run`, which an earlier submit of
    # the session made (its `inputs` holds both).
    coalesced: bool = False


class ScheduleData(WireModel):
    """A schedule as it stands: what it runs and when, when it fires next, when it last
    fired, how many runs its fires made and how many fires it skipped."""

    name: str
    cron: str
    tz: str
    runner: str
    input: dict[str, Any]
    overlap: str
    catch_up_s: int
    paused: bool
    next_fire_at: AwareDatetime | None
    last_fire_at: AwareDatetime | None
    fired: int
    skipped: int


class SchedulesReply(Versioned):
    """The tenant's schedules (by name) after a schedule command; `made`: the runs a
    backfill made."""

    ok: Literal[True] = True
    tenant: str
    schedules: list[ScheduleData]
    made: int = 0


class RateLimitData(WireModel):
    """A rate limit, and what it holds of the last minute: the calls granted and their
    tokens (what each used once it answered, what it reserved before), and the runs
    whose model call waits for room under it."""

    key: str
    rpm: int | None
    tpm: int | None
    requests: int
    tokens: int
    waiting: int


class RateLimitsReply(Versioned):
    """Every rate limit, by key."""

    ok: Literal[True] = True
    limits: list[RateLimitData]


class WebhooksReply(Versioned):
    """A tenant's webhook endpoints; `secret` (`whsec_...`) only in the reply that made
    it; the deliveries not made yet, and the latest that failed for good (newest first)."""

    ok: Literal[True] = True
    tenant: str
    endpoints: list[WebhookEndpoint]
    secret: str | None = None
    pending: int = 0
    failed: list[WebhookFailure] = Field(default_factory=list)


class RunReply(Versioned):
    """The answer of `get` and `cancel`."""

    ok: Literal[True] = True
    run: RunSummary


class AbortSessionReply(Versioned):
    """The runs that `abort_session` canceled."""

    ok: Literal[True] = True
    canceled: list[str]


class EndTenantReply(Versioned):
    """The runs that `end_tenant` canceled, oldest first."""

    ok: Literal[True] = True
    canceled: list[str]


class ForgetTenantReply(Versioned):
    """What `forget_tenant` deleted; nothing while `active` runs of the tenant remain
    (active, or just ended with their last frames not stored yet)."""

    ok: Literal[True] = True
    forgotten: bool
    active: int = Field(ge=0)
    runs: int = Field(ge=0)
    releases: int = Field(ge=0)


class ListReply(Versioned):
    """A page of `list`, newest first (a waiting run with its `waiting_for`); `next`: the
    `before` of the page after it, or null when this is the last."""

    ok: Literal[True] = True
    runs: list[RunSummary]
    next: int | None = None


class ResumeReply(Versioned):
    """The run a `resume` answered (queued for its next attempt); `duplicate` when the
    answer with this `request_id` was given before (nothing changed now)."""

    ok: Literal[True] = True
    run: RunSummary
    duplicate: bool = False


class SignalReply(Versioned):
    """The run a `signal` was sent to. `delivered`: a wait of the run took it (its next
    attempt is queued); otherwise it is kept until the run waits for it. `duplicate`: a
    signal with this `request_id` was sent before (nothing changed now)."""

    ok: Literal[True] = True
    run: RunSummary
    delivered: bool
    duplicate: bool = False


class LiveCursor(WireModel):
    """Where to continue after a join's replay: deliver by start sequence."""

    stream: str
    subject: str
    stream_seq: int = Field(ge=1)


class JoinReply(Versioned):
    """Every frame after the cursor known so far, and where live frames continue.

    `live` is null when the run has ended and `replay` is complete.
    """

    ok: Literal[True] = True
    run: RunSummary
    replay: list[Frame]
    live: LiveCursor | None


class BudgetReply(Versioned):
    """A tenant's limits and where it stands: the token budget (None: none), what its
    runs used (settled) and hold reserved, what is left (None without a limit); the same
    for cost units (`cost`, `cost_used`, ...); its quotas (None: none) with its active
    runs and the runs it submitted today (UTC)."""

    ok: Literal[True] = True
    tenant: str
    tokens: int | None
    used: int
    reserved: int
    left: int | None
    cost: int | None = None
    cost_used: int = 0
    cost_reserved: int = 0
    cost_left: int | None = None
    max_active_runs: int | None = None
    max_runs_per_day: int | None = None
    active_runs: int = 0
    runs_today: int = 0
    # Fair share: the weight an operator set (null: 1), the jobs its runs may hold at once
    # (queued for an executor or running; the stack's default times the weight), how
    # many hold one now, and its queue: capacity and runs waiting for an attempt now.
    share: int | None = None
    share_runs: int | None = None
    issued_runs: int = 0
    max_queued_runs: int | None = None
    queued_runs: int = 0
    # Of those queued, the runs whose model call waits for room under a rate limit.
    rate_limited_runs: int = 0
    # Runs of one concurrency key that may hold a job at once (null: no limit).
    max_runs_per_key: int | None = None


class PolicyReply(Versioned):
    """A tenant's policy: the effect kinds its runs may perform, and its version (each
    set_policy adds one). Version 0: no policy was ever set, and a tenant without one may
    perform no effect kind (`effects` is then `[]`) until an operator allows some.
    `effects`: a list of kinds (empty: none), or null: every kind (set explicitly)."""

    ok: Literal[True] = True
    tenant: str
    effects: list[str] | None
    version: int

    def allows(self, kind: str) -> bool:
        """Whether the tenant's runs may perform effects of `kind`."""
        return self.version > 0 and (self.effects is None or kind in self.effects)


class ReleaseReply(Versioned):
    """A release as stored; `digest` identifies its definition."""

    ok: Literal[True] = True
    release_id: str
    version: int
    digest: str
    nodes: int
    created: bool
