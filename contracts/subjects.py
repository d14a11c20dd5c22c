"""Subject and stream names. Every name hangs off one prefix (`rw` by default).

A prefix other than `rw` isolates a deployment (or a test) on a shared NATS server.
"""

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "rw"
DEFAULT_TENANT = "default"
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The second tokens of the services' own subjects (jobs, raw frames, health requests,
# cancel notices): a tenant of one of these names would share their subject space (its
# JetStream API, `<prefix>.jobs.JS.API.job`, is a job subject).
RESERVED_TENANTS = frozenset({"jobs", "frames", "health", "ctl"})
PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# A runner's name is one subject token (its jobs' subjects carry it) and a consumer name.
RUNNER_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
# An effect kind names an adapter (`http`, `noop`, one in the group `runwire.effects`).
EFFECT_KIND_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
# A signal's name (commands.SignalCommand, a workflow's signal node).
SIGNAL_NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,100}$"
COMMANDS = (
    "submit",
    "release",
    "cancel",
    "get",
    "list",
    "abort_session",
    "end_tenant",
    "forget_tenant",
    "resume",
    "signal",
    "reschedule",
    "set_schedule",
    "remove_schedule",
    "list_schedules",
    "backfill_schedule",
    "set_webhooks",
    "get_webhooks",
    "resolve_effect",
    "set_budget",
    "get_budget",
    "set_policy",
    "get_policy",
    "set_rate_limit",
    "get_rate_limits",
    "join",
)


@dataclass(frozen=True)
class Subjects:
    """All subject and stream names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not PREFIX_PATTERN.match(self.prefix):
            raise ValueError(f"invalid subject prefix {self.prefix!r}")

    # -- streams -------------------------------------------------------------
    @property
    def jobs_stream(self) -> str:
        return f"{self.prefix.upper()}_JOBS"

    @property
    def frames_in_stream(self) -> str:
        return f"{self.prefix.upper()}_FRAMES_IN"

    @property
    def run_frames_stream(self) -> str:
        return f"{self.prefix.upper()}_RUN_FRAMES"

    @property
    def events_stream(self) -> str:
        return f"{self.prefix.upper()}_EVENTS"

    @property
    def threads_bucket(self) -> str:
        """The gateway's own key-value bucket of LangGraph threads (not a wire subject)."""
        return f"{self.prefix.upper()}_THREADS"

    # -- subjects ------------------------------------------------------------
    def command(self, tenant: str, name: str) -> str:
        """`<prefix>.<tenant>.cmd.<name>`: a command, request/reply."""
        return f"{self.prefix}.{tenant}.cmd.{name}"

    def command_wildcard(self, name: str) -> str:
        return f"{self.prefix}.*.cmd.{name}"

    def jetstream_api(self, tenant: str) -> str:
        """`<prefix>.<tenant>.JS.API`: the JetStream API prefix of a tenant's clients
        (the submitter checks each request, then passes it on to the server's)."""
        return f"{self.prefix}.{tenant}.JS.API"

    def tenant_of_command(self, subject: str) -> str:
        """The tenant token of a command subject."""
        return subject.split(".")[1]

    def job(self, runner: str, run_id: str) -> str:
        """A run's job: one subject per run, so that recovery can see whether it is there,
        under its runner's name, so that only executors with that runner take it. (Five
        tokens ending in `job`: no stream's subjects may overlap another's, whatever the
        tenant or the runner is called.)"""
        return f"{self.prefix}.jobs.{runner}.{run_id}.job"

    def jobs_of(self, runner: str) -> str:
        """Every job of one runner (the filter of that runner's consumer)."""
        return f"{self.prefix}.jobs.{runner}.*.job"

    @property
    def jobs_wildcard(self) -> str:
        return f"{self.prefix}.jobs.*.*.job"

    @staticmethod
    def run_of_job(subject: str) -> str:
        """The run id of a job subject."""
        return subject.split(".")[3]

    def frames_in(self, tenant: str, run_id: str) -> str:
        """Where attempts of versions before one store per frame published raw frames
        (`frames_in_stream`; a relay removes that stream once it is empty)."""
        return f"{self.prefix}.frames.in.{tenant}.{run_id}"

    def frames_out(self, tenant: str, run_id: str) -> str:
        """Where an attempt (or a service closing a run) publishes a run's numbered frames:
        the frames stream stores each under the run's client subject (`run_frames`). Only
        services may publish here; followers read the stored frames only."""
        return f"{self.prefix}.frames.out.{tenant}.{run_id}"

    @property
    def frames_out_wildcard(self) -> str:
        return f"{self.prefix}.frames.out.*.*"

    @property
    def frames_out_stored(self) -> str:
        """The run's client subject as a mapping's destination: how the frames stream
        stores a frame published on `frames_out`."""
        return f"{self.prefix}.{{{{wildcard(1)}}}}.runs.{{{{wildcard(2)}}}}.frames"

    @property
    def frames_live_republished(self) -> str:
        """Where the frames stream republishes each frame it stored (`live_frames`)."""
        return f"{self.prefix}.{{{{wildcard(1)}}}}.runs.{{{{wildcard(2)}}}}.live"

    def live_frames(self, tenant: str, run_id: str) -> str:
        """`<prefix>.<tenant>.runs.<run_id>.live`: each frame of the run the stream stored,
        as it stores it, for a plain subscription (no replay, no consumer)."""
        return f"{self.prefix}.{tenant}.runs.{run_id}.live"

    @property
    def live_frames_wildcard(self) -> str:
        """Every run's live subject (what the relay archives from)."""
        return f"{self.prefix}.*.runs.*.live"

    @staticmethod
    def live_of(frames_subject: str) -> str:
        """The live subject of a run's frames subject."""
        return frames_subject.removesuffix(".frames") + ".live"

    def run_frames(self, tenant: str, run_id: str) -> str:
        """Where clients read a run's frames, in `seq` order."""
        return f"{self.prefix}.{tenant}.runs.{run_id}.frames"

    @staticmethod
    def run_of_frames(subject: str) -> str:
        """The run id of a run's client frames subject."""
        return subject.split(".")[3]

    @property
    def run_frames_wildcard(self) -> str:
        return f"{self.prefix}.*.runs.*.frames"

    def events(self, tenant: str, run_id: str) -> str:
        return f"{self.prefix}.{tenant}.events.{run_id}"

    @property
    def events_wildcard(self) -> str:
        return f"{self.prefix}.*.events.*"

    def health(self, service: str) -> str:
        """Where a service answers health requests."""
        return f"{self.prefix}.health.{service}"

    def cancel_notice(self, run_id: str) -> str:
        """Core-NATS notice from the submitter to executors: abort this run now."""
        return f"{self.prefix}.ctl.cancel.{run_id}"

    @property
    def cancel_notice_wildcard(self) -> str:
        return f"{self.prefix}.ctl.cancel.*"


# The inbox prefix of the gateway's own connection (for its bucket of threads); no
# tenant's (`_INBOX_<tenant>`) can be it.
GATEWAY_INBOX = "_GATEWAY_INBOX"
# NATS's default inbox prefix: a client that sets none (a product's own app on a broker
# that enforces no identities; the stack's health probe).
DEFAULT_INBOX = "_INBOX"
# The inbox of a service's own connection (`_SVC_INBOX_<service>`): its JetStream API
# replies and publish acknowledgements, and its replicas' probes, arrive there and no
# other service's or client's do. No tenant's (`_INBOX_<tenant>`) can be it.
SERVICE_INBOX = "_SVC_INBOX"
# Where some service may deliver a reply: a tenant's inbox, NATS's default, a service's.
_INBOX_SUBJECT = re.compile(r"^(_INBOX(_[A-Za-z0-9_-]{1,64})?|_SVC_INBOX_[a-z]+)\.[^.\s]")


def inbox_prefix(tenant: str) -> str:
    """The inbox prefix of a tenant's connections (`_INBOX_<tenant>`): on a broker that
    enforces identities, a tenant's replies (and its consumers' deliveries) arrive only
    under it."""
    return f"_INBOX_{tenant}"


def valid_tenant(tenant: str) -> bool:
    """A tenant is one subject token of 1-64 letters, digits, `_` or `-`, and none of
    `RESERVED_TENANTS`."""
    return bool(TENANT_PATTERN.match(tenant)) and tenant not in RESERVED_TENANTS


def service_inbox(service: str) -> str:
    """The inbox prefix of a service's own connection (`_SVC_INBOX_<service>`)."""
    return f"{SERVICE_INBOX}_{service}"


def reply_inboxes(tenant: str) -> tuple[str, str]:
    """Where a command of `tenant` is answered: under its own inbox prefix
    (`_INBOX_<tenant>.`, which every client acting for it uses: its own, the gateway's,
    the operator's) or NATS's default (`_INBOX.`, a client that sets no prefix on a
    broker that enforces no identities). A request naming any other reply subject (a
    jobs subject, another tenant's frames, events or inbox) gets no answer at all: the
    reply subject is the requester's choice, and a service must not publish for it."""
    return f"{inbox_prefix(tenant)}.", f"{DEFAULT_INBOX}."


def is_inbox(subject: str) -> bool:
    """Whether `subject` lies in an inbox (a tenant's, NATS's default, a service's):
    where a health reply, which any identity may ask for, may go."""
    return bool(_INBOX_SUBJECT.match(subject))
