"""What supervisord runs for a local stack: its nats-server(s) and Postgres first, then
every service replica and the gateways, each with the settings that wire it to the servers:
their URLs, the authority of the nats-servers' certificate, its own identity, its metrics
port.
"""

from __future__ import annotations

import os

from runwire.client.settings import rotated
from runwire.contracts.identities import GATEWAY, service_user
from runwire.infra.auth import Identities
from runwire.infra.layout import Layout
from runwire.infra.ports import GATEWAY_HOST, metrics_ports
from runwire.infra.postgres import EmbeddedPostgres
from runwire.infra.settings_files import nats_tls, service_identity
from runwire.infra.supervisor import Program, environment, venv_tool
from runwire.infra.topology import Topology
from runwire.runtime.settings import CommonSettings


def stack_programs(
    layout: Layout,
    shape: Topology,
    pg: EmbeddedPostgres,
    database_url: str,
    settings: CommonSettings,
    identities: Identities,
) -> list[Program]:
    """nats-server(s) and Postgres first, then every service replica and the gateways
    wired to them."""
    programs = [
        Program(
            name,
            node.command(),
            node.data_dir,
            {"priority": "10", "stopsignal": "TERM", "stopwaitsecs": "15"},
        )
        for name, node in shape.nats_programs().items()
    ]
    pg_options = {"priority": "10", "stopsignal": "INT", "stopwaitsecs": "30"}
    user = pg.run_as_user()
    if user is not None:
        pg_options["user"] = user
    programs.append(Program("postgres", pg.command(), layout.pg_dir, pg_options))
    wiring = {
        "RUNWIRE_DATABASE_URL": database_url,
        "RUNWIRE_PREFIX": settings.prefix,
        **nats_tls(shape),
        "PYTHONUNBUFFERED": "1",
        # Trace export settings of the shell that starts the stack.
        **{k: v for k, v in os.environ.items() if k.startswith("OTEL_")},
    }
    if shape.clustered:
        wiring["RUNWIRE_STREAM_REPLICAS"] = str(len(shape.nats))
    ports = metrics_ports(settings.metrics_port, shape.programs)
    for replica in shape.replicas:
        # One port each: on the shell's one port, all but the first would crash-loop.
        metrics = {"RUNWIRE_METRICS_PORT": str(ports.get(replica.program, 0))}
        identity = service_identity(identities, replica.service, database_url)
        nats = {"RUNWIRE_NATS_URL": replica.nats_url}
        programs.append(
            Program(
                replica.program,
                [str(venv_tool("python")), "-m", f"runwire.{replica.service}"],
                layout.repo,
                {
                    "priority": "100",
                    "environment": environment({**wiring, **nats, **metrics, **identity}),
                    # Services wait for NATS and Postgres themselves; a few quick exits
                    # while the servers come up must not mark them FATAL.
                    "startretries": "10",
                    "stopsignal": "TERM",
                    "stopwaitsecs": "20",
                },
            )
        )
    gateway = service_user(GATEWAY)
    urls = [node.url for node in shape.nats]
    for i, (name, port) in enumerate(shape.gateways().items()):
        programs.append(
            Program(
                name,
                [str(venv_tool("python")), "-m", "runwire.gateway"],
                layout.repo,
                {
                    "priority": "100",
                    "environment": environment(
                        {
                            **wiring,
                            "RUNWIRE_NATS_URL": rotated(urls, i),
                            "RUNWIRE_NATS_USER": gateway,
                            "RUNWIRE_NATS_PASSWORD": identities.passwords[gateway],
                            "RUNWIRE_GATEWAY_HOST": GATEWAY_HOST,
                            "RUNWIRE_GATEWAY_PORT": str(port),
                            "RUNWIRE_GATEWAY_KEYS_FILE": str(layout.api_keys_file),
                            "RUNWIRE_GATEWAY_SIGNAL_SECRET": identities.signal_secret,
                        }
                    ),
                    "startretries": "10",
                    "stopsignal": "TERM",
                    "stopwaitsecs": "10",
                },
            )
        )
    return programs
