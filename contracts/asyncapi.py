"""The AsyncAPI document of every subject runwire serves or publishes (`make docs`).

The document is FastStream's: a NatsBroker that is declared, never connected or run,
whose subscribers and publishers mirror runwire's subjects, with the contract models as
message schemas. Subjects come from `Subjects` with `{tenant}`, `{run_id}` and
`{service}` as placeholders, so a renamed subject shows up here. `main()` writes
`docs/asyncapi.json` and a self-contained `docs/asyncapi.html`; a unit test fails when
the committed files are stale.
"""

import html
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from faststream.nats import NatsBroker
from faststream.specification import AsyncAPI

from contracts.commands import (
    AbortSessionCommand,
    CancelCommand,
    GetCommand,
    JoinCommand,
    SubmitCommand,
)
from contracts.errors import ErrorReply
from contracts.events import RunEvent
from contracts.frames import Frame, Job, RawFrame
from contracts.health import HealthReply
from contracts.replies import AbortSessionReply, JoinReply, RunReply, SubmitReply
from contracts.subjects import DEFAULT_PREFIX, Subjects

DOCS_DIR = Path(__file__).resolve().parents[1] / "docs"
JSON_PATH = DOCS_DIR / "asyncapi.json"
HTML_PATH = DOCS_DIR / "asyncapi.html"

TITLE = "runwire"
# The wire contract's version (every body carries `"v": 1`), not the package's.
WIRE_VERSION = "1"
EXAMPLE_SERVER = "nats://127.0.0.1:4222"
# Where nats-py sends a request's reply unless the client sets another inbox prefix.
REPLY_INBOX = "_INBOX.>"

TENANT = "{tenant}"
RUN_ID = "{run_id}"
SERVICE = "{service}"

DESCRIPTION = f"""Durable execution for AI agent runs over NATS JetStream and Postgres.

Every subject hangs off one prefix (`{DEFAULT_PREFIX}` here; a deployment may choose
another). Commands are core-NATS request/reply: the reply (`ok: true` with the command's
reply body, or an `ErrorReply`) goes to the requester's inbox. Every body is JSON with
`"v": 1`; unknown fields are rejected."""


def _command_reply(broker: NatsBroker, subjects: Subjects, name: str, schema: object) -> None:
    """A command's reply: sent to the requester's inbox, not to a subject of ours."""
    broker.publisher(
        REPLY_INBOX,
        title=f"cmd.{name}.reply",
        description=(
            f"Reply to `{subjects.command(TENANT, name)}`, sent to the request's reply "
            "subject (the requester's inbox): the command's reply body, or an `ErrorReply`."
        ),
        schema=schema,
    )


def build_broker(prefix: str = DEFAULT_PREFIX) -> NatsBroker:
    """A broker that only describes runwire's subjects. Never connect or run it."""
    s = Subjects(prefix)
    broker = NatsBroker(
        EXAMPLE_SERVER,
        specification_url=EXAMPLE_SERVER,
        description="Any NATS server with JetStream; this URL is the services' default.",
    )

    # -- commands (submitter): request/reply on `<prefix>.<tenant>.cmd.<name>` --------
    @broker.subscriber(
        s.command(TENANT, "submit"),
        title="cmd.submit",
        description="Submit a run. Reply: `SubmitReply` or `ErrorReply`.",
    )
    async def submit(body: SubmitCommand) -> None: ...

    @broker.subscriber(
        s.command(TENANT, "cancel"),
        title="cmd.cancel",
        description="Cancel a run. Reply: `RunReply` or `ErrorReply`.",
    )
    async def cancel(body: CancelCommand) -> None: ...

    @broker.subscriber(
        s.command(TENANT, "get"),
        title="cmd.get",
        description="Read a run's summary. Reply: `RunReply` or `ErrorReply`.",
    )
    async def get(body: GetCommand) -> None: ...

    @broker.subscriber(
        s.command(TENANT, "abort_session"),
        title="cmd.abort_session",
        description=(
            "Cancel every active run of a session. Reply: `AbortSessionReply` or `ErrorReply`."
        ),
    )
    async def abort_session(body: AbortSessionCommand) -> None: ...

    @broker.subscriber(
        s.command(TENANT, "join"),
        title="cmd.join",
        description="Wait for a run to end. Reply: `JoinReply` or `ErrorReply`.",
    )
    async def join(body: JoinCommand) -> None: ...

    _command_reply(broker, s, "submit", SubmitReply | ErrorReply)
    _command_reply(broker, s, "cancel", RunReply | ErrorReply)
    _command_reply(broker, s, "get", RunReply | ErrorReply)
    _command_reply(broker, s, "abort_session", AbortSessionReply | ErrorReply)
    _command_reply(broker, s, "join", JoinReply | ErrorReply)

    # -- what clients read ------------------------------------------------------------
    broker.publisher(
        s.run_frames(TENANT, RUN_ID),
        title="runs.frames",
        description=(
            f"A run's frames in `seq` order (relay; JetStream stream `{s.run_frames_stream}`)."
            " `seq` increases across attempts; `done` is last."
        ),
        schema=Frame,
    )
    broker.publisher(
        s.events(TENANT, RUN_ID),
        title="events",
        description=(f"Every recorded transition of a run (JetStream stream `{s.events_stream}`)."),
        schema=RunEvent,
    )

    # -- health: request/reply, empty request -----------------------------------------
    @broker.subscriber(
        s.health(SERVICE),
        title="health",
        description="Health request (empty body) to one service. Reply: `HealthReply`.",
    )
    async def health() -> None: ...

    broker.publisher(
        REPLY_INBOX,
        title="health.reply",
        description=f"Reply to `{s.health(SERVICE)}`, sent to the requester's inbox.",
        schema=HealthReply,
    )

    # -- internal: between runwire's own services -------------------------------------
    @broker.subscriber(
        s.job(RUN_ID),
        title="jobs",
        description=(
            f"Internal. A run's job: published by the submitter (and recovery), consumed by "
            f"executors (JetStream work-queue stream `{s.jobs_stream}`)."
        ),
    )
    async def jobs(body: Job) -> None: ...

    @broker.subscriber(
        s.frames_in(TENANT, RUN_ID),
        title="frames.in",
        description=(
            f"Internal. Raw frames of an attempt: published by the executor, consumed by the "
            f"relay (JetStream stream `{s.frames_in_stream}`, partitioned by run)."
        ),
    )
    async def frames_in(body: RawFrame) -> None: ...

    @broker.subscriber(
        s.cancel_notice(RUN_ID),
        title="ctl.cancel",
        description=(
            "Internal. Core-NATS notice (empty body) from the submitter to executors: abort "
            "this run's attempt now. Best effort; the database is the fallback."
        ),
    )
    async def cancel_notice() -> None: ...

    return broker


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document as a JSON-compatible dict."""
    spec = AsyncAPI(
        build_broker(),
        title=TITLE,
        version=WIRE_VERSION,
        description=DESCRIPTION,
        schema_version="3.0.0",
    ).to_specification()
    loaded: dict[str, Any] = json.loads(spec.to_json())
    return loaded


def render_json(doc: dict[str, Any]) -> str:
    """Stable text: sorted keys, so that the committed file is reproducible."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _ref_name(ref: str) -> str:
    """The last part of a local `$ref`, unquoted."""
    return unquote(ref.rsplit("/", 1)[-1])


def _payload_names(doc: dict[str, Any], message_ref: str) -> list[str]:
    """The schema names a message's payload refers to (one, or each of a union)."""
    schemas = doc["components"]["schemas"]
    name = _ref_name(doc["components"]["messages"][_ref_name(message_ref)]["payload"]["$ref"])
    union = [_ref_name(item["$ref"]) for item in schemas[name].get("anyOf", ())]
    return union or [name]


def render_html(doc: dict[str, Any]) -> str:
    """A self-contained page (no CDN assets): channels, operations and message schemas."""
    e = html.escape
    rows = []
    for op_name, op in sorted(doc["operations"].items()):
        channel = doc["channels"][_ref_name(op["channel"]["$ref"])]
        messages = [
            name
            for ref in op["messages"]
            for name in _payload_names(doc, channel["messages"][_ref_name(ref["$ref"])]["$ref"])
        ]
        links = " | ".join(f'<a href="#schema-{e(n)}">{e(n)}</a>' for n in messages)
        rows.append(
            f"<tr><td><code>{e(channel['address'])}</code></td><td>{e(op_name)}</td>"
            f"<td>{e(op['action'])}</td><td>{links}</td>"
            f"<td>{e(channel.get('description', ''))}</td></tr>"
        )
    schemas = [
        f'<h3 id="schema-{e(name)}">{e(name)}</h3>\n'
        f"<pre>{e(json.dumps(schema, indent=2, sort_keys=True))}</pre>"
        for name, schema in sorted(doc["components"]["schemas"].items())
        if not name.endswith(":Payload")
    ]
    info = doc["info"]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{e(info['title'])} AsyncAPI</title>\n"
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;"
        "vertical-align:top;text-align:left}pre{background:#f6f6f6;padding:1em;"
        "overflow:auto}</style>\n</head>\n<body>\n"
        f"<h1>{e(info['title'])} — AsyncAPI {e(doc['asyncapi'])}, wire v{e(info['version'])}"
        "</h1>\n"
        f"<p>{e(info.get('description', ''))}</p>\n"
        "<p>Generated by <code>make docs</code> from <code>contracts/asyncapi.py</code>; "
        'the full document is <a href="asyncapi.json">asyncapi.json</a>.</p>\n'
        "<h2>Channels</h2>\n<table>\n<tr><th>Subject</th><th>Operation</th>"
        "<th>Action</th><th>Message</th><th>Description</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>\n<h2>Schemas</h2>\n"
        + "\n".join(schemas)
        + "\n</body>\n</html>\n"
    )


def render() -> dict[Path, str]:
    """Path → text of each generated file."""
    doc = document()
    return {JSON_PATH: render_json(doc), HTML_PATH: render_html(doc)}


def main() -> None:
    """Write `docs/asyncapi.json` and `docs/asyncapi.html`."""
    DOCS_DIR.mkdir(exist_ok=True)
    for path, text in render().items():
        path.write_text(text)
        sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
