"""Settings of each service: one pydantic-settings class each, env prefix `RUNWIRE_`.

Defaults are named constants so the docs and the tests can quote them.
"""

import ipaddress
import re
from datetime import timedelta
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# A service reads its settings as the gateway does (re-exported for the services).
from runwire.client.settings import EXIT_CONFIG as EXIT_CONFIG
from runwire.client.settings import from_env as from_env
from runwire.contracts.subjects import DEFAULT_PREFIX, PREFIX_PATTERN

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_NATS_PING_INTERVAL_MS = 10_000
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/runwire"
DEFAULT_QUEUE_CAPACITY = 10_000
DEFAULT_FRAME_STREAM_MAX_AGE_S = 3_600
DEFAULT_MAX_INPUT_BYTES = 256 * 1024
DEFAULT_MAX_METADATA_BYTES = 16 * 1024
DEFAULT_MAX_SESSION_WAITING = 100
DEFAULT_MAX_FRAMES_PER_RUN = 100_000
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_ATTEMPT_TIMEOUT_MS = 600_000
DEFAULT_SUPERSEDE_GRACE_MS = 5_000
DEFAULT_MAX_IN_FLIGHT = 64
# A tenant's share of jobs at once: one executor's slots.
DEFAULT_TENANT_SHARE_RUNS = DEFAULT_MAX_IN_FLIGHT
DEFAULT_ACK_WAIT_MS = 30_000
DEFAULT_HEARTBEAT_MS = 2_000
DEFAULT_CANCEL_POLL_MS = 1_000
DEFAULT_LEASE_TTL_MS = 15_000
DEFAULT_RETRY_BASE_MS = 500
DEFAULT_RETRY_MAX_MS = 30_000
DEFAULT_ABORT_GRACE_MS = 1_000
DEFAULT_RESUME_WAIT_MS = 2_000
DEFAULT_EFFECT_CLAIM_MS = 30_000
DEFAULT_EFFECT_RECONCILE_MS = 5_000
DEFAULT_DRAIN_MS = 10_000
DEFAULT_PUBLISH_PATIENCE_MS = 30_000
# The longest a text delta may be held for later ones to join it (`coalesce_ms`).
MAX_COALESCE_MS = 1_000
DEFAULT_SEGMENT_FLUSH_MS = 250
DEFAULT_SEGMENT_BYTES = 64 * 1024
DEFAULT_REPLAY_MAX_BYTES = 512 * 1024
DEFAULT_PARTITION_TIMEOUT_MS = 10_000
DEFAULT_RECOVERY_INTERVAL_MS = 1_000
DEFAULT_LEASE_WATCH_MS = 200
DEFAULT_RECOVERY_BACKOFF_MS = 200
# After Postgres comes back (a restart ends every session, so every executor is taking
# its presence lock again), presence locks are believed only after this long.
DEFAULT_PRESENCE_SETTLE_MS = 10_000
DEFAULT_MAX_RECOVERIES = 3
DEFAULT_REPUBLISH_AFTER_MS = 30_000
# What a tenant's own JetStream consumers may be (recovery removes any other).
DEFAULT_TENANT_MAX_CONSUMERS = 256
DEFAULT_TENANT_CONSUMER_MAX_INACTIVE_MS = 300_000
DEFAULT_TENANT_CONSUMER_MAX_DELIVER = 10
DEFAULT_CONSUMER_SWEEP_MS = 10_000
DEFAULT_UNSERVED_TIMEOUT_MS = 600_000
# Clients following runs live at once (and for a few seconds after each stops): the run
# frames stream's consumer limit.
DEFAULT_FRAME_FOLLOWERS = 100_000
DEFAULT_OUTBOX_INTERVAL_MS = 100
DEFAULT_OUTBOX_GRACE_MS = 2_000
DEFAULT_FRAME_RETENTION = timedelta(hours=24)
DEFAULT_STREAM_PURGE_GRACE = timedelta(minutes=10)
DEFAULT_DURABLE_SLEEP_S = 30.0
DEFAULT_EFFECT_PENDING_WAIT_S = 30.0


class CommonSettings(BaseSettings):
    """What every service needs: where NATS and Postgres are, names, stream limits."""

    model_config = SettingsConfigDict(
        env_prefix="RUNWIRE_", extra="ignore", use_attribute_docstrings=True
    )

    nats_url: str = DEFAULT_NATS_URL
    """NATS server, or the servers of a cluster separated by commas (the first that
    answers is used)."""
    nats_ping_interval_ms: int = Field(default=DEFAULT_NATS_PING_INTERVAL_MS, ge=100)
    """How often a service pings its NATS server; after 3 pings unanswered it takes the
    server for gone and connects to another server of the cluster."""
    tenant_consumer_max_inactive_ms: int = Field(
        default=DEFAULT_TENANT_CONSUMER_MAX_INACTIVE_MS, ge=1_000
    )
    """A tenant's consumer must go at most this long after its client stops reading
    (its inactive threshold): the submitter refuses to make one that would stay longer,
    and recovery removes one made otherwise."""
    nats_user: str | None = None
    """The service's NATS identity, on a broker that enforces identities (see
    Security)."""
    nats_password: SecretStr | None = None
    """The password of that identity."""
    nats_tls_ca: Path | None = None
    """The certificate authority (a PEM file) of the NATS servers' certificates: the
    service connects with TLS and checks the server's certificate (its URL's name or
    address must be in it)."""
    database_url: str = DEFAULT_DATABASE_URL
    """Postgres database."""
    prefix: str = Field(default=DEFAULT_PREFIX, pattern=PREFIX_PATTERN.pattern)
    """Subject prefix (`[a-z][a-z0-9_]{0,31}`); stream names use it upper-cased."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """`DEBUG`, `INFO`, `WARNING` or `ERROR`."""
    log_format: Literal["auto", "json", "text"] = "auto"
    """`json` lines, `text`, or `auto` (text on a terminal, else JSON)."""
    event_loop: Literal["auto", "asyncio"] = "auto"
    """A service process's event loop: `auto` is uvloop where it is installed (as
    `faststream run` and uvicorn choose), `asyncio` the standard library's."""
    queue_capacity: int = Field(default=DEFAULT_QUEUE_CAPACITY, ge=1)
    """Most jobs the jobs stream holds; beyond it a submit fails with `QUEUE_FULL`."""
    frame_stream_max_age_s: int = Field(default=DEFAULT_FRAME_STREAM_MAX_AGE_S, ge=60)
    """Longest time the run frames stream keeps a frame; Postgres keeps them after."""
    max_frame_followers: int = Field(default=DEFAULT_FRAME_FOLLOWERS, ge=1)
    """Clients that may follow runs live at once: each is a consumer of the run frames
    stream until a few seconds after it stops; past it a client reads by joins
    (nats-server otherwise stops at 1,000)."""
    stream_replicas: int = Field(default=1, ge=1, le=5)
    """Replicas of every stream; 3 on a JetStream cluster of three. Every service
    declares the same value."""
    db_pool_size: int = Field(default=10, ge=1, le=100)
    """Postgres connections per process, all opened at start and kept open."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the Prometheus `/metrics` endpoint (0: none); under `make up` the first
    of four, one per service."""
    metrics_host: str = "0.0.0.0"
    """Address the `/metrics` endpoint listens on: every interface by default (a scraper
    on another host or pod); `127.0.0.1` keeps it to this host."""
    runners: str = ""
    """Submitter and executor: runners that are not packaged,
    `name=package.module:object,...` (beside the entry-point group
    `runwire.runners`)."""
    fault_points: str = ""
    """Tests only: named fault points where the process kills itself
    (`outbox.committed=kill`, ...; `services/runtime/faults.py`)."""


class SubmitterSettings(CommonSettings):
    """The submitter: validation limits and per-run defaults."""

    max_input_bytes: int = Field(default=DEFAULT_MAX_INPUT_BYTES, ge=1024)
    """Largest run `input`, as JSON bytes."""
    max_metadata_bytes: int = Field(default=DEFAULT_MAX_METADATA_BYTES, ge=0)
    """Largest run `metadata`, as JSON bytes (`PAYLOAD_TOO_LARGE` past it)."""
    max_session_waiting: int = Field(default=DEFAULT_MAX_SESSION_WAITING, ge=1)
    """Runs of one session active or waiting their turn at once; an `enqueue` submit
    past it gets `SESSION_BUSY`."""
    default_max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1)
    """Attempts of a run that does not set `max_attempts`."""
    default_attempt_timeout_ms: int = Field(default=DEFAULT_ATTEMPT_TIMEOUT_MS, ge=100)
    """Deadline of an attempt when the run sets none."""
    supersede_grace_ms: int = Field(default=DEFAULT_SUPERSEDE_GRACE_MS, ge=0, le=600_000)
    """How long a canceled or superseded run that is still running may keep its session
    busy: the next run of the session starts when it ends or after this, whichever
    first."""
    tenant_share_runs: int = Field(default=DEFAULT_TENANT_SHARE_RUNS, ge=1, le=1_000_000)
    """Fair share: jobs one tenant's runs may hold at once (queued for an executor or
    running), times the tenant's `share` (an operator's `set_budget`); its further runs
    wait in Postgres and get their job as its earlier runs end, so a tenant with much
    queued never keeps another's runs waiting behind its own. Set it to the executors'
    slots in all (`RUNWIRE_MAX_IN_FLIGHT` of each): a tenant alone can then fill them."""
    tenant_queue_capacity: int = Field(default=DEFAULT_QUEUE_CAPACITY, ge=1, le=2**31 - 1)
    """Runs one tenant may have waiting for an attempt; past it its submits fail
    `QUEUE_FULL` (an operator's `set_budget` `max_queued_runs` sets a tenant's own),
    whatever other tenants hold."""
    priority_max_wait_ms: int = Field(default=60_000, ge=1, le=86_400_000)
    """How long a run waiting for its tenant's share may be passed over by runs of a
    higher `priority`: past it, it gets the next job of its tenant (no priority starves)."""


def _items(value: str) -> list[str]:
    return [item for item in value.split(",") if item.strip()]


def _host_list(value: str) -> str:
    if not all(_HOST.match(h.strip().lower().rstrip(".")) for h in _items(value)):
        raise ValueError("not a comma-separated list of host names (or *.example.com)")
    return value


def _network_list(value: str) -> str:
    try:
        for item in _items(value):
            ipaddress.ip_network(item.strip(), strict=False)
    except ValueError:
        raise ValueError("not a comma-separated list of CIDRs (e.g. 10.0.0.0/8)") from None
    return value


# A host name of an allow-list, or `*.` and a domain.
_HOST = re.compile(r"^(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?$")


class ExecutorSettings(CommonSettings):
    """The executor: in-flight limit, heartbeats, leases, retries, shutdown."""

    executor_id: str = ""
    """Lease owner name in Postgres and logs (empty: `host:pid:random`)."""
    tools: str = ""
    """Tools that are not packaged, `name=package.module:object,...` (beside the
    entry-point group `runwire.tools`)."""
    isolated_runners: str = ""
    """Runners whose attempts each run in a process of their own, with none of the
    executor's credentials: everything they do (frames, checkpoints, effects, budgets)
    goes through the executor, for their run only (comma-separated names, or `*` for
    all; see docs/security.md). Each must be an entry point or in `RUNWIRE_RUNNERS`."""
    max_in_flight: int = Field(default=DEFAULT_MAX_IN_FLIGHT, ge=1)
    """Attempts of each runner at once in this process, and `max_ack_pending` of the
    runner's shared consumer (the global cap), for runners that declare no
    `max_in_flight`."""
    max_frames_per_run: int = Field(default=DEFAULT_MAX_FRAMES_PER_RUN, ge=10)
    """Frames a run's runner may emit over all its attempts; past it the run fails with
    `PAYLOAD_TOO_LARGE` (its closing frames still follow)."""
    ack_wait_ms: int = Field(default=DEFAULT_ACK_WAIT_MS, ge=500)
    """JetStream ack wait of the jobs consumer."""
    heartbeat_ms: int = Field(default=DEFAULT_HEARTBEAT_MS, ge=50)
    """Lease renewal and in-progress ack; at most half of ack wait and lease TTL."""
    cancel_poll_ms: int = Field(default=DEFAULT_CANCEL_POLL_MS, ge=20)
    """How often a running attempt checks Postgres for a cancel."""
    lease_ttl_ms: int = Field(default=DEFAULT_LEASE_TTL_MS, ge=200)
    """A lease not renewed for this long is expired by recovery."""
    retry_base_ms: int = Field(default=DEFAULT_RETRY_BASE_MS, ge=0)
    """First retry backoff (doubles per attempt, jittered)."""
    retry_max_ms: int = Field(default=DEFAULT_RETRY_MAX_MS, ge=0)
    """Longest retry backoff."""
    effect_pending_wait_s: float = Field(default=DEFAULT_EFFECT_PENDING_WAIT_S, gt=0)
    """How long a run whose effect's outcome its adapter says is pending waits (holding
    no worker) before it asks the adapter again."""
    durable_sleep_s: float = Field(default=DEFAULT_DURABLE_SLEEP_S, gt=0)
    """A runner's `ctx.sleep` of this many seconds or more is a durable timer: the
    attempt ends and the run waits, holding no worker, until the time has come."""
    abort_grace_ms: int = Field(default=DEFAULT_ABORT_GRACE_MS, ge=0)
    """How long a runner may take to stop after an abort before it is abandoned."""
    resume_wait_ms: int = Field(default=DEFAULT_RESUME_WAIT_MS, ge=0)
    """How long a resuming attempt waits for the relay to store what the attempt before
    it published (so that a retry takes back nothing); then it resumes from what is
    stored."""
    effect_claim_ms: int = Field(default=DEFAULT_EFFECT_CLAIM_MS, ge=100)
    """How long a side effect's claim holds: its dispatch must answer within it, or the
    effect fails with `EFFECT_DEADLINE_EXCEEDED`."""
    effect_reconcile_ms: int = Field(default=DEFAULT_EFFECT_RECONCILE_MS, ge=20)
    """How often an executor reconciles the effects that runs which ended left `claimed`
    or `unknown` (of the kinds it has adapters for)."""
    effect_http_allow_hosts: str = ""
    """The only hosts the `http` effect adapter may send requests to, comma-separated
    (`*.example.com`: any name under example.com); empty: any public host. See
    Security, "Effects and outbound requests"."""
    effect_http_allow_networks: str = ""
    """Private networks (CIDRs, comma-separated) the `http` effect adapter may reach
    although they are not public: loopback, RFC 1918, link-local and the like are
    refused otherwise."""
    drain_ms: int = Field(default=DEFAULT_DRAIN_MS, ge=0)
    """How long shutdown waits for attempts to be returned."""
    publish_patience_ms: int = Field(default=DEFAULT_PUBLISH_PATIENCE_MS, ge=0)
    """How long an attempt keeps trying a frame NATS does not store (a stream without a
    leader while JetStream elects one) before it fails, retryable."""
    coalesce_text: bool = True
    """Text deltas a runner emits while its previous `message` frame is on its way to
    the stream join into one frame (the same text, fewer frames; a first delta is never
    held); false: one frame per delta, whatever the pace."""
    coalesce_ms: int = Field(default=0, ge=0, le=MAX_COALESCE_MS)
    """With `coalesce_text`, hold a text delta that follows another up to this long for
    the deltas after it to join it (fewer frames for many slow streams, at up to this
    much latency for each delta but the first after any other frame); 0: a delta waits
    only for the frame before it to be stored."""

    @field_validator("effect_http_allow_hosts")
    @classmethod
    def _hosts(cls, value: str) -> str:
        # The executor's http adapter reads it (runwire.runners.outbound); checked here
        # too so that a malformed one stops the executor as any bad setting does.
        return _host_list(value)

    @field_validator("effect_http_allow_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        return _network_list(value)

    @model_validator(mode="after")
    def _heartbeat_inside_limits(self) -> Self:
        # A heartbeat must land well inside both clocks it renews, or a healthy attempt
        # is redelivered (ack_wait) or recovered (lease) while it is still running.
        if self.heartbeat_ms * 2 > min(self.ack_wait_ms, self.lease_ttl_ms):
            raise ValueError("heartbeat_ms must be at most half of ack_wait_ms and lease_ttl_ms")
        return self


class RelaySettings(CommonSettings):
    """The relay: how frames are packed into Postgres segments, join limits."""

    segment_flush_ms: int = Field(default=DEFAULT_SEGMENT_FLUSH_MS, ge=1)
    """A run's buffered frames are written to Postgres (one segment) at most this long
    after the first of them; at once with a tool, effect, node, wait, `error` or `done`
    frame. Longer: fewer, larger segments (a join reads what is not written yet from the
    stream)."""
    segment_bytes: int = Field(default=DEFAULT_SEGMENT_BYTES, ge=1024)
    """A run's buffer is written at once past this size."""
    replay_max_bytes: int = Field(default=DEFAULT_REPLAY_MAX_BYTES, ge=1024)
    """Largest replay in one join reply (a longer one comes in several, read one while
    the next is on its way)."""
    partition_timeout_ms: int = Field(default=DEFAULT_PARTITION_TIMEOUT_MS, ge=2_000)
    """A relay that stops answering (frozen, or cut off from Postgres) loses the archive
    (the writing of the frames stream to Postgres) after this long, and a standby relay
    takes it over."""


class RecoverySettings(CommonSettings):
    """The recovery service: its tick, what it re-drives, how long frames are kept."""

    outbox_interval_ms: int = Field(default=DEFAULT_OUTBOX_INTERVAL_MS, ge=10)
    """How often the outbox is swept: run events, jobs that became due (a retry after
    its backoff), what a crashed service left."""
    outbox_grace_ms: int = Field(default=DEFAULT_OUTBOX_GRACE_MS, ge=100)
    """How long the service that committed a transition has to publish what it implies
    before the sweep does (a repeat is stored once either way)."""
    frame_retention: timedelta = DEFAULT_FRAME_RETENTION
    """An ended run's segments are deleted this long after it ended (seconds, or ISO
    8601: `PT24H`, `P1D`)."""
    stream_purge_grace: timedelta = DEFAULT_STREAM_PURGE_GRACE
    """An ended run's subject is purged from the run frames stream this long after it
    ended (Postgres has it all)."""
    recovery_interval_ms: int = Field(default=DEFAULT_RECOVERY_INTERVAL_MS, ge=10)
    """Time between ticks."""
    waiting_gauges_interval_ms: int = Field(default=15_000, ge=10)
    """How often the gauges of waiting runs (`runwire_waiting_runs`,
    `runwire_waiting_oldest_seconds`) are measured: their query reads every waiting run,
    so it is not run at each tick (a tick's cost does not grow with runs that wait)."""
    lease_watch_ms: int = Field(default=DEFAULT_LEASE_WATCH_MS, ge=10)
    """How often, besides its tick, recovery looks for runs whose executor is gone (its
    presence lock freed) or whose lease ran out (one query each time)."""
    recovery_backoff_ms: int = Field(default=DEFAULT_RECOVERY_BACKOFF_MS, ge=0)
    """Delay before a recovering run may be claimed."""
    max_recoveries: int = Field(default=DEFAULT_MAX_RECOVERIES, ge=1)
    """Recoveries without checkpoint progress before a run is `interrupted`."""
    presence_settle_ms: int = Field(default=DEFAULT_PRESENCE_SETTLE_MS, ge=0)
    """Recovery believes executors' presence locks (a dead executor's runs are taken
    over at once) only once its own lock session has lived this long: after Postgres
    restarted, every executor takes its lock again."""
    republish_after_ms: int = Field(default=DEFAULT_REPUBLISH_AFTER_MS, ge=100)
    """How often the stream is checked for the job of a run that waits for an attempt;
    a run whose job is gone (stream deleted or purged) gets a new one."""
    unserved_timeout_ms: int = Field(default=DEFAULT_UNSERVED_TIMEOUT_MS, ge=100)
    """A run that waited this long for a first attempt under a runner no executor
    serves (no consumer of its jobs on the jobs stream) fails with `QUEUE_TIMEOUT`, and
    its job leaves the jobs stream, whatever its queue timeout."""
    batch_size: int = Field(default=500, ge=1)
    """Runs handled per step of a tick."""
    tenant_max_consumers: int = Field(default=DEFAULT_TENANT_MAX_CONSUMERS, ge=1)
    """JetStream consumers one tenant may hold on the frames stream, and on the events
    stream. Past it, recovery first removes one that no client reads any more (a client
    that stopped following a run leaves its consumer for a few seconds), else the newest
    (and any consumer that is durable, delivers outside the tenant's inbox, outlives its
    client longer than `tenant_consumer_max_inactive_ms` or redelivers more than
    `tenant_consumer_max_deliver` times, as soon as it is created)."""
    tenant_consumer_max_deliver: int = Field(default=DEFAULT_TENANT_CONSUMER_MAX_DELIVER, ge=1)
    """A tenant's acknowledged consumer may deliver a message at most this many
    times."""
    consumer_sweep_ms: int = Field(default=DEFAULT_CONSUMER_SWEEP_MS, ge=100)
    """How often recovery looks at every tenant consumer (besides each one created, at
    once)."""
    webhook_interval_ms: int = Field(default=500, ge=10)
    """How often recovery looks for webhook deliveries that are due."""
    webhook_timeout_ms: int = Field(default=10_000, ge=100, le=120_000)
    """How long a webhook endpoint has to answer a delivery (2xx: delivered)."""
    webhook_max_attempts: int = Field(default=8, ge=1, le=100)
    """Attempts of a webhook delivery before it fails for good (and is kept, to be seen
    with `runwire webhooks`)."""
    webhook_retry_base_ms: int = Field(default=1_000, ge=1)
    """The wait before a delivery's second attempt; it doubles at each attempt after,
    up to an hour."""
    webhook_allow_hosts: str = ""
    """The only hosts webhooks may be delivered to, comma-separated (`*.example.com`:
    any name under example.com); empty: any public host."""
    webhook_allow_networks: str = ""
    """Private networks (CIDRs, comma-separated) webhooks may be delivered to although
    they are not public: loopback, RFC 1918, link-local and the like are refused
    otherwise (the address each name resolves to is checked, at every delivery)."""

    @field_validator("webhook_allow_hosts")
    @classmethod
    def _webhook_hosts(cls, value: str) -> str:
        return _host_list(value)

    @field_validator("webhook_allow_networks")
    @classmethod
    def _webhook_networks(cls, value: str) -> str:
        return _network_list(value)

    @field_validator("frame_retention", "stream_purge_grace", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        # Environment values arrive as text: plain seconds ("86400") are accepted too.
        if isinstance(value, str) and value.replace(".", "", 1).isdigit():
            return float(value)
        return value
