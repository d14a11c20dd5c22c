"""The settings files a local stack writes: `env` (where the stack is and the authority
of its servers' certificate, with the default tenant's identity and API key, for the CLI
and for scripts), the operator's, each service's for one started by hand beside the
stack, and the tenants' brought up to date; the identities and the nats-server's
`authorization` block made from them; and the shell's `RUNWIRE_*` settings they start from.
"""

from __future__ import annotations

from pydantic import ValidationError

from runwire.contracts.identities import OPERATOR, SERVICES, service_user
from runwire.contracts.subjects import DEFAULT_TENANT, Subjects
from runwire.gateway.keys import add_key, new_key
from runwire.gateway.settings import GatewaySettings
from runwire.infra.auth import (
    WHERE_SETTINGS,
    Identities,
    database_url_as,
    read_env_file,
    render,
    service_role,
    tenant_settings,
    write_env_file,
    write_private,
)
from runwire.infra.layout import Layout
from runwire.infra.ports import gateway_url, metrics_ports, metrics_url
from runwire.infra.readiness import say
from runwire.infra.topology import Topology
from runwire.runtime.settings import CommonSettings

# `.runwire/env` names each service's metrics endpoint as this + the service, upper-cased.
METRICS_URL = "RUNWIRE_METRICS_URL_"
GATEWAY_URL = "RUNWIRE_GATEWAY_URL"


def shell_settings() -> CommonSettings | None:
    """The settings every service reads from this shell's `RUNWIRE_*` variables."""
    try:
        return CommonSettings()
    except ValidationError as exc:
        say(f"A RUNWIRE_* variable of this shell is invalid, so no service would start:\n{exc}")
        return None


def stack_identities(layout: Layout, settings: CommonSettings) -> Identities:
    """The stack's identities (made on its first start), with the `default` tenant's,
    and the server's `authorization` block written from them."""
    path = layout.identities_file
    identities = Identities.load(path) if path.exists() else Identities.generate()
    identities.add_tenant(DEFAULT_TENANT)
    write_private(layout.auth_file, render(identities, Subjects(settings.prefix)))
    identities.save(path)  # with the hashes render made
    return identities


def gateway_scheme() -> str:
    """`https` when this shell gives the gateway a certificate and its key
    (`RUNWIRE_GATEWAY_TLS_CERT`, `RUNWIRE_GATEWAY_TLS_KEY`): it then answers HTTPS only.
    Else `http`: a browser opening the console on loopback meets no certificate warning."""
    try:
        given = GatewaySettings().gateway_tls_cert is not None
    except ValidationError:
        return "http"  # the gateway refuses these settings at start, and `up` says why
    return "https" if given else "http"


def nats_tls(shape: Topology) -> dict[str, str]:
    """What every client and service of the stack is given to connect with TLS: the
    authority of the servers' certificate."""
    return {} if shape.nats_ca is None else {"RUNWIRE_NATS_TLS_CA": str(shape.nats_ca)}


def service_identity(identities: Identities, service: str, database_url: str) -> dict[str, str]:
    """A service's identities: on NATS, and in Postgres (its own role)."""
    user = service_user(service)
    return {
        "RUNWIRE_NATS_USER": user,
        "RUNWIRE_NATS_PASSWORD": identities.passwords[user],
        "RUNWIRE_DATABASE_URL": database_url_as(database_url, service_role(service)),
    }


def operator_identity(layout: Layout) -> tuple[str | None, str | None]:
    """The operator's identity, for the stack's own health requests."""
    if not layout.identities_file.exists():
        return None, None
    return OPERATOR, Identities.load(layout.identities_file).passwords.get(OPERATOR)


def read_env(layout: Layout) -> dict[str, str]:
    """The settings in `.runwire/env`."""
    return read_env_file(layout.env_file)


def write_env(
    layout: Layout,
    shape: Topology,
    database_url: str,
    settings: CommonSettings,
    identities: Identities,
) -> dict[str, str]:
    """Write `.runwire/env` (where the stack is, the authority its servers' certificate
    is signed by, and the default tenant's identity and API key, for the CLI and for
    scripts), the operator's settings and each service's; bring each tenant's settings
    file up to date with where the stack is now."""
    where = {
        "RUNWIRE_NATS_URL": shape.nats_url,
        "RUNWIRE_DATABASE_URL": database_url,
        "RUNWIRE_PREFIX": settings.prefix,
        **nats_tls(shape),
    }
    # The default tenant's API key: the one it had, else a new one (its hash is what the
    # gateway keeps).
    key = read_env_file(layout.env_file).get("RUNWIRE_API_KEY") or new_key()
    add_key(layout.api_keys_file, DEFAULT_TENANT, key)
    scheme = gateway_scheme()
    env = {
        **where,
        **tenant_settings(identities, DEFAULT_TENANT),
        GATEWAY_URL: gateway_url(shape.gateway_ports[0], scheme),
        "RUNWIRE_API_KEY": key,
    }
    if shape.clustered:
        env["RUNWIRE_GATEWAY_URLS"] = ",".join(
            gateway_url(port, scheme) for port in shape.gateway_ports
        )
    for program, port in metrics_ports(settings.metrics_port, shape.programs).items():
        name = program.upper().replace("-", "_")
        env[f"{METRICS_URL}{name}"] = metrics_url(settings.metrics_host, port)
    write_env_file(layout.env_file, env)
    # The tenants added before: where the stack is now, and what it speaks.
    for path in sorted(layout.tenants_dir.glob("*.env")):
        values = read_env_file(path)
        values.update({k: v for k, v in env.items() if k in (*WHERE_SETTINGS, GATEWAY_URL)})
        write_env_file(path, values)
    operator = {
        "RUNWIRE_NATS_USER": OPERATOR,
        "RUNWIRE_NATS_PASSWORD": identities.passwords[OPERATOR],
    }
    write_env_file(
        layout.operator_env_file, {**where, "RUNWIRE_TENANT": DEFAULT_TENANT, **operator}
    )
    # A service started by hand beside a clustered stack declares its streams alike.
    streams = {"RUNWIRE_STREAM_REPLICAS": str(len(shape.nats))} if shape.clustered else {}
    for service in SERVICES:
        write_env_file(
            layout.service_env_file(service),
            {**where, **streams, **service_identity(identities, service, database_url)},
        )
    return env
