"""Identities the broker enforces: one NATS user per service and per tenant, each allowed
exactly the subjects it needs, written as a nats-server `authorization` block.

- **Services** (`svc-submitter`, `svc-executor`, `svc-relay`, `svc-recovery`): each
  subscribes only to the commands, notices and health requests it answers and publishes
  only what it sends (only executors and the outbox publish a run's frames, on
  `<prefix>.frames.out.>`, which the frames stream stores under the run's client
  subject; only the submitter sends cancel notices, only the outbox and
  recovery publish jobs and run events); it answers requests only into inboxes (each
  tenant's, NATS's default, its own: never `allow_responses`, which would publish
  wherever a requester points the reply), hears replies only in its own inbox
  (`_SVC_INBOX_<service>`), and may ask its own service's health (its replicas'
  probes do).
  They manage the streams and consumers (`$JS.API.>`).
- **Tenants** (`tenant-<name>`): request their own commands (`<prefix>.<tenant>.cmd.>`,
  but not `set_budget`, `set_policy`, `resolve_effect`, `end_tenant` or the rate limits:
  an operator's), receive
  replies only on their own inbox prefix (`_INBOX_<tenant>.>`), and read only their own
  runs' frames and events: core subscriptions under `<prefix>.<tenant>.runs.>` and
  `.events.>`, and JetStream through their own API prefix
  (`<prefix>.<tenant>.JS.API.>`), whose requests the submitter checks before it passes
  them on (services/submitter/jetstream.py: consumers filtered to the tenant's runs,
  ephemeral, unacknowledged, delivering into its inbox; stored messages of its own
  subjects): nothing under `$JS.API`, whose consumer configurations the broker cannot
  look into, but the last stored frame of one of their runs (the subject form of the
  direct get, `$JS.API.DIRECT.GET.<stream>.<subject>`). They may answer their push
  consumers' flow control (`$JS.FC.<stream>.>`). Nothing else: no stream management, no
  jobs, no control subjects, no other tenant's subjects.
- **The gateway** (`svc-gateway`): what every tenant's clients may do, for the tenants
  there are (it acts for the tenant a request's API key names; the keys' hashes are in
  `.runwire/api-keys.json`, each tenant's key in its settings file).
- **The operator** (`operator`): every tenant's commands, the admin ones among them.

Secrets are made here (`secrets.token_urlsafe`), kept in `.runwire/identities.json`
(mode 0600, never committed), and never logged; the server's configuration holds only
their bcrypt hashes, so it reveals no password to whoever reads it (a Kubernetes Secret's
reader, a backup).
"""

import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import bcrypt

from runwire.contracts.identities import (
    ALTERNATE,
    GATEWAY,
    OPERATOR,
    SERVICES,
    is_tenant_user,
    service_user,
    tenant_of_user,
    tenant_user,
)
from runwire.contracts.subjects import (
    COMMANDS,
    DEFAULT_INBOX,
    DEFAULT_TENANT,
    GATEWAY_INBOX,
    RESERVED_TENANTS,
    Subjects,
    inbox_prefix,
    service_inbox,
    valid_tenant,
)
from runwire.gateway.keys import add_key, expire_tenant_keys, new_key, remove_tenant_keys
from runwire.infra.embedded import ROUTE_USER, reload_server

# Commands only an operator may send, whatever the tenant.
ADMIN_COMMANDS = (
    "set_budget",
    "set_policy",
    "resolve_effect",
    "end_tenant",
    "forget_tenant",
    "set_rate_limit",
    "get_rate_limits",
)
# The routes of a deployment's three servers (infra/deploy: the headless Service's names
# in Kubernetes, network aliases in compose.yaml).
DEPLOY_ROUTES = ("nats-0.nats:6222", "nats-1.nats:6222", "nats-2.nats:6222")
# The cost of the bcrypt hashes the server's configuration holds (nats-server checks one
# at each connection: about 60 ms of its CPU at 10).
BCRYPT_ROUNDS = 10


# The identities every stack has: the services', the gateway's, the operator's.
STANDING = (*(service_user(s) for s in SERVICES), service_user(GATEWAY), OPERATOR)


@dataclass
class Identities:
    """Every identity's password, by user name, and the bcrypt hash of each that the
    server's configuration holds instead of the password."""

    passwords: dict[str, str] = field(default_factory=dict)
    # The user each tenant's clients connect as now, where it is not `tenant-<name>`
    # (after a rotation).
    current: dict[str, str] = field(default_factory=dict)
    # What the servers of a deployment's cluster route with (`nats-routes.conf`).
    route_secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    # What signs the gateway's signal URLs (RUNWIRE_GATEWAY_SIGNAL_SECRET).
    signal_secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    # name -> (a digest of the password it was made from, its bcrypt hash): a hash is made
    # once per password (bcrypt is slow on purpose), not at every render.
    hashes: dict[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def generate(cls) -> "Identities":
        """A password for each service and for the operator."""
        return cls({name: secrets.token_urlsafe(32) for name in STANDING})

    @classmethod
    def load(cls, path: Path) -> "Identities":
        """The identities saved at `path`, with any standing one a stack made by an older
        runwire lacks (the gateway's) added."""
        saved = json.loads(path.read_text())
        hashes = {name: (str(h[0]), str(h[1])) for name, h in saved.get("hashes", {}).items()}
        found = cls(dict(saved["passwords"]), dict(saved.get("current", {})), hashes=hashes)
        found.route_secret = str(saved.get("route_secret") or found.route_secret)
        found.signal_secret = str(saved.get("signal_secret") or found.signal_secret)
        for name in STANDING:
            found.passwords.setdefault(name, secrets.token_urlsafe(32))
        return found

    def save(self, path: Path) -> None:
        """Write, readable by this user only."""
        hashes = {name: list(h) for name, h in self.hashes.items() if name in self.passwords}
        saved = {
            "passwords": self.passwords,
            "current": self.current,
            "route_secret": self.route_secret,
            "signal_secret": self.signal_secret,
            "hashes": hashes,
        }
        write_private(path, json.dumps(saved, indent=2))

    def hashed(self, name: str) -> str:
        """The bcrypt hash of `name`'s password, as nats-server checks it (`$2a$`)."""
        password = self.passwords[name].encode()
        digest = hashlib.sha256(password).hexdigest()
        known = self.hashes.get(name)
        if known is None or known[0] != digest:
            salt = bcrypt.gensalt(rounds=BCRYPT_ROUNDS, prefix=b"2a")
            known = (digest, bcrypt.hashpw(password, salt).decode())
            self.hashes[name] = known
        return known[1]

    @property
    def tenants(self) -> list[str]:
        return sorted({tenant_of_user(n) for n in self.passwords if is_tenant_user(n)})

    def user_of(self, tenant: str) -> str:
        """The NATS user the tenant's clients connect as now."""
        return self.current.get(tenant, tenant_user(tenant))

    def add_tenant(self, tenant: str) -> str:
        """Create the tenant's identity (or return the one it has); its password."""
        if not valid_tenant(tenant):
            raise ValueError(
                f"invalid tenant name {tenant!r}: 1-64 letters, digits, '-' or '_', and "
                f"none of {', '.join(sorted(RESERVED_TENANTS))}"
            )
        return self.passwords.setdefault(self.user_of(tenant), secrets.token_urlsafe(32))

    def remove_tenant(self, tenant: str) -> bool:
        """Forget the tenant's identity (both users, while it rotates); whether it had one."""
        self.current.pop(tenant, None)
        self.passwords.pop(tenant_user(tenant) + ALTERNATE, None)
        return self.passwords.pop(tenant_user(tenant), None) is not None

    def _other_user(self, tenant: str) -> str:
        plain = tenant_user(tenant)
        return plain + ALTERNATE if self.user_of(tenant) == plain else plain

    def rotate_tenant(self, tenant: str) -> str:
        """New credentials for the tenant: a user of its own beside the current one (see
        ALTERNATE), which becomes current; the previous user and its password stay
        valid until `finish_rotation`. KeyError: no such tenant; ValueError: a rotation
        is under way (finish it first)."""
        if self.user_of(tenant) not in self.passwords:
            raise KeyError(tenant)
        other = self._other_user(tenant)
        if other in self.passwords:
            raise ValueError(f"tenant {tenant}'s previous rotation is not finished")
        self.passwords[other] = secrets.token_urlsafe(32)
        if other == tenant_user(tenant):
            self.current.pop(tenant, None)
        else:
            self.current[tenant] = other
        return self.passwords[other]

    def finish_rotation(self, tenant: str) -> bool:
        """Stop accepting the tenant's previous user; whether there was one."""
        return self.passwords.pop(self._other_user(tenant), None) is not None


def service_role(service: str) -> str:
    """The Postgres role a service connects as (migration 0015 creates the four)."""
    return f"runwire_{service}"


def database_url_as(url: str, role: str) -> str:
    """`url` with `role` as its user and no password (a server that trusts loopback, as
    the local stack's does; a deployment gives each service its own URL instead)."""
    parts = urlsplit(url)
    netloc = f"{role}@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def tenant_settings(identities: Identities, tenant: str) -> dict[str, str]:
    """A tenant's client settings (beside where the stack is)."""
    user = identities.user_of(tenant)
    return {
        "RUNWIRE_TENANT": tenant,
        "RUNWIRE_NATS_USER": user,
        "RUNWIRE_NATS_PASSWORD": identities.passwords[user],
    }


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by this user only (it holds secrets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def write_env_file(path: Path, values: dict[str, str]) -> None:
    """A settings file (`KEY=value` lines) that the CLI, the SDK and `set -a; . FILE`
    read; private, as it may hold a secret."""
    write_private(path, "".join(f"{key}={value}\n" for key, value in values.items()))


def service_permissions(
    service: str, subjects: Subjects, tenants: list[str] | None = None
) -> dict[str, Any]:
    """What a service may publish and subscribe to. Its replies go only into inboxes:
    each tenant's of `tenants`, NATS's default (the stack's health probe) and its own
    (its replicas' probes). Not `allow_responses`, which lets a responder publish to
    whatever reply subject a requester names: a tenant naming a jobs subject, another
    tenant's frames or a cancel notice would have had a service publish there."""
    p = subjects.prefix
    own = f"{service_inbox(service)}.>"
    subscribe = [own, subjects.health(service)]
    # Its own health too: a replica's readiness probe asks it as the service's identity
    # (`runwire health <service> --local`, with replies in the service's own inbox).
    publish = [*_stream_api(subjects), "$JS.ACK.>", subjects.health(service), own]
    publish.append(f"{DEFAULT_INBOX}.>")
    publish += [f"{inbox_prefix(tenant)}.>" for tenant in tenants or []]
    if service == "submitter":
        subscribe += [f"{p}.*.cmd.{name}" for name in COMMANDS if name != "join"]
        # Tenants' JetStream API requests, which it checks and passes on.
        subscribe.append(f"{subjects.jetstream_api('*')}.>")
        publish += [f"{p}.jobs.>", f"{p}.frames.out.>", f"{p}.ctl.cancel.>"]
    elif service == "executor":
        subscribe += [f"{p}.ctl.cancel.>"]
        publish += [f"{p}.jobs.>", f"{p}.frames.out.>"]
    elif service == "relay":
        # Every frame the frames stream stores, as it republishes it (the archive).
        subscribe += [f"{p}.*.cmd.join", subjects.live_frames_wildcard]
    elif service == "recovery":
        publish += [f"{p}.jobs.>", f"{p}.frames.out.>", f"{p}.*.events.>"]
        # Consumers created and removed on the streams tenants read (it polices them).
        subscribe += [
            f"$JS.EVENT.ADVISORY.CONSUMER.*.{stream}.*"
            for stream in (subjects.run_frames_stream, subjects.events_stream)
        ]
    else:
        raise ValueError(f"unknown service {service!r}")
    return {
        "publish": {"allow": publish, "deny": _service_denied(service, subjects)},
        "subscribe": {"allow": subscribe},
    }


def _stream_api(subjects: Subjects) -> list[str]:
    """The JetStream API a service may call: on runwire's four streams only (declare and
    reconcile them, read them, and their consumers), so a stolen service identity cannot
    make a stream of its own that would store another's subjects (a tenant's inbox)."""
    api = ["$JS.API.INFO", "$JS.API.STREAM.NAMES"]
    for stream in (
        subjects.jobs_stream,
        subjects.frames_in_stream,
        subjects.run_frames_stream,
        subjects.events_stream,
    ):
        api += [
            f"$JS.API.STREAM.CREATE.{stream}",
            f"$JS.API.STREAM.UPDATE.{stream}",
            f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.API.STREAM.MSG.GET.{stream}",
            f"$JS.API.STREAM.PURGE.{stream}",
            f"$JS.API.DIRECT.GET.{stream}",
            f"$JS.API.DIRECT.GET.{stream}.>",
            f"$JS.API.CONSUMER.*.{stream}",  # LIST, NAMES, CREATE (unnamed)
            f"$JS.API.CONSUMER.*.{stream}.>",  # CREATE, INFO, DELETE, MSG.NEXT
            f"$JS.API.CONSUMER.*.*.{stream}.>",  # DURABLE.CREATE
        ]
    return api


def _service_denied(service: str, subjects: Subjects) -> list[str]:
    """The JetStream API calls no service makes: deleting or snapshotting streams,
    deleting messages, account and server operations; and purges, which only recovery
    makes, of ended runs' client frames and of jobs no executor will take."""
    denied = [
        "$JS.API.STREAM.DELETE.>",
        "$JS.API.STREAM.MSG.DELETE.>",
        "$JS.API.STREAM.SNAPSHOT.>",
        "$JS.API.STREAM.RESTORE.>",
        "$JS.API.STREAM.PEER.>",
        "$JS.API.STREAM.LEADER.>",
        "$JS.API.ACCOUNT.>",
        "$JS.API.META.>",
        "$JS.API.SERVER.>",
    ]
    if service != "recovery":
        return [*denied, "$JS.API.STREAM.PURGE.>"]
    others = (subjects.frames_in_stream, subjects.events_stream)
    return [*denied, *(f"$JS.API.STREAM.PURGE.{stream}" for stream in others)]


def tenant_permissions(tenant: str, subjects: Subjects) -> dict[str, Any]:
    """What a tenant's clients may publish and subscribe to (see the module)."""
    p = subjects.prefix
    runs, events = f"{p}.{tenant}.runs.>", f"{p}.{tenant}.events.>"
    return {
        "publish": {
            "allow": [
                f"{p}.{tenant}.cmd.>",
                # Its JetStream API, which the submitter checks (services/submitter/
                # jetstream.py), and the flow-control answers of its push consumers.
                f"{subjects.jetstream_api(tenant)}.>",
                f"$JS.FC.{subjects.run_frames_stream}.>",
                f"$JS.FC.{subjects.events_stream}.>",
                # The last stored frame of one of its runs, by the subject form of the
                # direct get (the subject is in the permission): how its client learns
                # whether a run it just submitted has frames yet, without a hop.
                f"$JS.API.DIRECT.GET.{subjects.run_frames_stream}.{runs}",
                f"{p}.health.*",
            ],
            "deny": [f"{p}.{tenant}.cmd.{name}" for name in ADMIN_COMMANDS],
        },
        "subscribe": {"allow": [f"{inbox_prefix(tenant)}.>", runs, events]},
    }


def gateway_permissions(tenants: list[str], subjects: Subjects) -> dict[str, Any]:
    """What each tenant's clients may do, for every tenant there is: the gateway acts
    for the tenant of each request's key, and for no one else (a tenant added or
    removed changes this with the server's configuration)."""
    allowed: dict[str, dict[str, list[str]]] = {
        "publish": {"allow": [], "deny": []},
        "subscribe": {"allow": []},
    }
    for tenant in tenants:
        own = tenant_permissions(tenant, subjects)
        for direction, rules in own.items():
            for kind, subjects_of in rules.items():
                for subject in subjects_of:
                    if subject not in allowed[direction][kind]:
                        allowed[direction][kind].append(subject)
    if not tenants:  # no tenant to act for
        allowed["publish"]["allow"] = [f"{subjects.prefix}.health.*"]
    # Its own key-value bucket of LangGraph threads, on a connection with its own inbox.
    kv, stream = subjects.threads_bucket, f"KV_{subjects.threads_bucket}"
    allowed["publish"]["allow"] += [
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$KV.{kv}.>",
        # Listing a tenant's threads: a consumer of the listing's own, read, then deleted.
        f"$JS.API.CONSUMER.CREATE.{stream}.*.$KV.{kv}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.API.CONSUMER.DELETE.{stream}.*",
    ]
    allowed["subscribe"]["allow"].append(f"{GATEWAY_INBOX}.>")
    return allowed


def operator_permissions(subjects: Subjects) -> dict[str, Any]:
    """Every tenant's commands, health, and reading what the queue and streams hold
    (`runwire top`); purging a removed tenant's frames, events and threads and deleting
    its consumers (`runwire tenant remove`); no other stream management, no jobs, raw
    frames or control subjects."""
    p = subjects.prefix
    tenants_streams = (subjects.run_frames_stream, subjects.events_stream)
    forget = [
        *(f"$JS.API.STREAM.PURGE.{stream}" for stream in tenants_streams),
        f"$JS.API.STREAM.PURGE.KV_{subjects.threads_bucket}",
        *(f"$JS.API.CONSUMER.DELETE.{stream}.*" for stream in tenants_streams),
    ]
    return {
        "publish": {
            "allow": [
                f"{p}.*.cmd.>",
                f"{subjects.jetstream_api('*')}.>",
                f"{p}.health.*",
                "$JS.API.INFO",
                "$JS.API.STREAM.INFO.*",
                "$JS.API.CONSUMER.INFO.*.*",
                "$JS.API.CONSUMER.LIST.*",
                "$JS.API.CONSUMER.NAMES.*",
                f"$JS.API.CONSUMER.CREATE.{subjects.run_frames_stream}.*.{p}.*.runs.>",
                f"$JS.API.CONSUMER.CREATE.{subjects.events_stream}.*.{p}.*.events.>",
                f"$JS.API.DIRECT.GET.{subjects.run_frames_stream}.{p}.*.runs.>",
                *forget,
            ]
        },
        "subscribe": {"allow": [">"]},
    }


def render(identities: Identities, subjects: Subjects) -> str:
    """The nats-server `authorization` block for these identities (JSON, which the
    server's configuration format accepts)."""
    users = []
    for name in sorted(identities.passwords):
        if name == service_user(GATEWAY):
            permissions = gateway_permissions(identities.tenants, subjects)
        elif name.startswith("svc-"):
            permissions = service_permissions(
                name.removeprefix("svc-"), subjects, identities.tenants
            )
        elif is_tenant_user(name):
            permissions = tenant_permissions(tenant_of_user(name), subjects)
        elif name == OPERATOR:
            permissions = operator_permissions(subjects)
        else:
            raise ValueError(f"unknown identity {name!r}")
        users.append(
            {"user": name, "password": identities.hashed(name), "permissions": permissions}
        )
    return (
        "# Written by runwire (infra/auth.py): every identity the broker accepts.\n"
        f"authorization: {json.dumps({'users': users}, indent=2)}\n"
    )


def render_routes(identities: Identities, hosts: tuple[str, ...] = DEPLOY_ROUTES) -> str:
    """The part of a deployment's `cluster` block that authenticates routes (user
    `route`): the password's bcrypt hash the servers check, and the routes to dial with
    the password. It holds the secret: a Secret's file, never a ConfigMap's."""
    secret = identities.route_secret
    salt = bcrypt.gensalt(rounds=BCRYPT_ROUNDS, prefix=b"2a")
    hashed = bcrypt.hashpw(secret.encode(), salt).decode()
    routes = ", ".join(json.dumps(f"nats-route://{ROUTE_USER}:{secret}@{h}") for h in hosts)
    return (
        "# Written by runwire (infra/auth.py): how the cluster's servers route to each other.\n"
        f"authorization: {{user: {ROUTE_USER}, password: {json.dumps(hashed)}}}\n"
        "# A server ignores its own address among the routes: one list serves all three.\n"
        f"routes: [{routes}]\n"
    )


# The files of a stack's folder (`.runwire/`, as `make up` lays it out).
IDENTITIES_FILE = "identities.json"
AUTH_FILE = "nats-auth.conf"
ROUTES_FILE = "nats-routes.conf"
ENV_FILE = "env"
TENANTS_DIR = "tenants"
NATS_PID_FILE = "nats/nats-server.pid"
API_KEYS_FILE = "api-keys.json"
OPERATOR_ENV_FILE = "operator.env"
# What a tenant's settings take from the stack's `env`: where the stack is, and the
# authority of its servers' certificate (clients connect with TLS when it is given).
WHERE_SETTINGS = ("RUNWIRE_NATS_URL", "RUNWIRE_PREFIX", "RUNWIRE_NATS_TLS_CA")


def read_env_file(path: Path) -> dict[str, str]:
    """The `KEY=value` lines of a settings file (none if there is no file)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def _stack_env(root: Path) -> dict[str, str]:
    return read_env_file(root / ENV_FILE)


def _apply(root: Path, identities: Identities) -> bool:
    """Save the identities, write the server's block, have the server read it; whether a
    running server was told."""
    prefix = _stack_env(root).get("RUNWIRE_PREFIX") or "rw"
    write_private(root / AUTH_FILE, render(identities, Subjects(prefix)))
    # A deployment's cluster.conf includes it (a local stack's servers have their own).
    write_private(root / ROUTES_FILE, render_routes(identities))
    identities.save(root / IDENTITIES_FILE)  # with the hashes render made
    # One server, or each server of a clustered stack (`nats/n1/`, ...).
    servers = [root / NATS_PID_FILE, *sorted((root / "nats").glob("n*/nats-server.pid"))]
    told = [reload_server(pid_file) for pid_file in servers]
    return any(told)


def add_tenant(root: Path, tenant: str) -> tuple[Path, bool]:
    """Create `tenant`'s identity in the stack at `root` and write its client settings to
    `tenants/<tenant>.env`; (that file, whether the running server took it)."""
    identities = _load_identities(root)
    identities.add_tenant(tenant)
    told = _apply(root, identities)
    stack = _stack_env(root)
    where = {k: v for k, v in stack.items() if k in WHERE_SETTINGS}
    env_file = root / TENANTS_DIR / f"{tenant}.env"
    known = read_env_file(env_file).get("RUNWIRE_API_KEY")
    # Its API key for the gateway (only the key's hash is kept beside the gateway).
    key = known or new_key()
    add_key(root / API_KEYS_FILE, tenant, key)
    http = {"RUNWIRE_API_KEY": key}
    if "RUNWIRE_GATEWAY_URL" in stack:
        http["RUNWIRE_GATEWAY_URL"] = stack["RUNWIRE_GATEWAY_URL"]
    write_env_file(env_file, {**where, **tenant_settings(identities, tenant), **http})
    return env_file, told


def rotate_tenant(root: Path, tenant: str, grace: timedelta) -> tuple[Path, bool]:
    """Give `tenant` a new password and a new API key and write them to its settings
    file; its previous password stays valid until `finish_rotation`, its previous keys
    for `grace` (or until then): (that file, whether the running server took it).
    KeyError: no such tenant; ValueError: a rotation is under way."""
    identities = _load_identities(root)
    if tenant not in identities.tenants:
        raise KeyError(tenant)
    identities.rotate_tenant(tenant)
    told = _apply(root, identities)
    key = new_key()
    add_key(root / API_KEYS_FILE, tenant, key)
    expire_tenant_keys(root / API_KEYS_FILE, tenant, datetime.now(UTC) + grace, keep=key)
    env_file = _write_tenant_settings(root, identities, tenant, key)
    return env_file, told


def finish_rotation(root: Path, tenant: str) -> tuple[bool, bool]:
    """Stop accepting `tenant`'s previous password (the server closes the connections
    made with it) and its previous API keys; (whether a rotation was under way, whether
    the running server took it)."""
    identities = _load_identities(root)
    had = identities.finish_rotation(tenant)
    told = _apply(root, identities) if had else False
    current = read_env_file(_tenant_env_file(root, tenant)).get("RUNWIRE_API_KEY")
    remove_tenant_keys(root / API_KEYS_FILE, tenant, keep=current)
    return had, told


def _load_identities(root: Path) -> Identities:
    path = root / IDENTITIES_FILE
    if not path.exists():
        raise FileNotFoundError(f"no identities in {root} (`make up` creates them)")
    return Identities.load(path)


def _tenant_env_file(root: Path, tenant: str) -> Path:
    """Where a tenant's client settings are: `.runwire/env` for the default tenant of a
    local stack, `tenants/<tenant>.env` for any other."""
    stack = root / ENV_FILE
    stack_tenant = read_env_file(stack).get("RUNWIRE_TENANT", DEFAULT_TENANT)
    if tenant == DEFAULT_TENANT == stack_tenant and stack.exists():
        return stack
    return root / TENANTS_DIR / f"{tenant}.env"


def _write_tenant_settings(root: Path, identities: Identities, tenant: str, key: str) -> Path:
    """Write the tenant's password and API key into its settings file (keeping the rest
    of what is there)."""
    env_file = _tenant_env_file(root, tenant)
    values = read_env_file(env_file)
    values.update(tenant_settings(identities, tenant))
    values["RUNWIRE_API_KEY"] = key
    write_env_file(env_file, values)
    return env_file


def remove_tenant(root: Path, tenant: str) -> tuple[bool, bool]:
    """Revoke `tenant`'s identity: the server closes its connections at once; (whether it
    had one, whether the running server took it)."""
    identities = _load_identities(root)
    had = identities.remove_tenant(tenant)
    told = _apply(root, identities) if had else False
    remove_tenant_keys(root / API_KEYS_FILE, tenant)
    (root / TENANTS_DIR / f"{tenant}.env").unlink(missing_ok=True)
    return had, told
