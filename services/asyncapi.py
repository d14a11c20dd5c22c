"""The AsyncAPI document of runwire, from the four services' own applications (`make docs`).

Each service's FastStream application is built as the service builds it (default
settings, prefix `rw`), never connected, and FastStream writes the AsyncAPI 3.0 document
of all four: every subscriber (commands, health, cancel notices) with the contract model
its handler takes and the handler's docstring, every publisher the services declare for
what they publish through the `Broker` seam (`runwire.runtime.publications`). Two
things FastStream 0.7 leaves out are added from the same applications:

- channel parameters: each `{tenant}` or `{run_id}` in an address, described;
- request/reply: a subscriber that answers names its reply models (`ServiceBroker.replies`:
  the handler's return model, and `ErrorReply` for a command), which become the
  operation's `reply`, on a channel with no fixed address (the requester's inbox).

`main()` writes `docs/asyncapi.json` and a self-contained `docs/asyncapi.html`, then
checks the document with the official AsyncAPI parser (`docs/validate/`, installed
with npm on first use). A unit test fails when the committed files are stale.

This module imports the four services, which no service may do: it is not one of them.
"""

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from faststream.specification import AsyncAPI
from pydantic import TypeAdapter

from runwire.contracts.subjects import DEFAULT_PREFIX
from runwire.executor.main import ExecutorService
from runwire.recovery.main import RecoveryService
from runwire.relay.main import RelayService
from runwire.runtime.app import Service
from runwire.runtime.settings import (
    DEFAULT_NATS_URL,
    ExecutorSettings,
    RecoverySettings,
    RelaySettings,
    SubmitterSettings,
)
from runwire.submitter.main import SubmitterService

DOCS_DIR = Path(__file__).resolve().parents[1] / "docs"
JSON_PATH = DOCS_DIR / "asyncapi.json"
HTML_PATH = DOCS_DIR / "asyncapi.html"
VALIDATOR_DIR = DOCS_DIR / "validate"

TITLE = "runwire"
# The wire contract's version (every body carries `"v": 1`), not the package's.
WIRE_VERSION = "1"

DESCRIPTION = f"""Durable execution for AI agent runs over NATS JetStream and Postgres.

Every subject hangs off one prefix (`{DEFAULT_PREFIX}` here; a deployment may choose
another). Commands are core-NATS request/reply in each service's queue group: the reply
(the command's reply body, or an `ErrorReply`) goes to the requester's inbox. Every body
is JSON with `"v": 1`; unknown fields are rejected."""

PARAMETERS = {
    "tenant": (
        "The tenant: one subject token of letters, digits, `_` or `-` (at most 64). A "
        "command's tenant is taken from its subject, never from its body."
    ),
    "run_id": "A run's id (a UUID).",
    "runner": (
        "A runner's name: lower-case letters, digits, `_` and `-`, starting with a letter "
        "(at most 64)."
    ),
}
_PARAMETER = re.compile(r"\{(\w+)\}")
_SCHEMA_REF = "#/components/schemas/{model}"


def services() -> list[Service[Any]]:
    """The four services, as their processes build them, with the documented defaults."""
    defaults: dict[str, Any] = {"prefix": DEFAULT_PREFIX, "nats_url": DEFAULT_NATS_URL}
    return [
        SubmitterService(SubmitterSettings(**defaults), own_process=False),
        ExecutorService(ExecutorSettings(**defaults), own_process=False),
        RelayService(RelaySettings(**defaults), own_process=False),
        RecoveryService(RecoverySettings(**defaults), own_process=False),
    ]


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document as a JSON-compatible dict."""
    apps = services()
    spec = AsyncAPI(
        *(service.faststream for service in apps),
        title=TITLE,
        version=WIRE_VERSION,
        description=DESCRIPTION,
        schema_version="3.0.0",
    ).to_specification()
    doc: dict[str, Any] = json.loads(spec.to_json())
    for channel in doc["channels"].values():
        _add_parameters(channel)
        if "description" in channel:
            # A handler's docstring, as one paragraph (its line breaks are the source's).
            channel["description"] = " ".join(channel["description"].split())
    for service in apps:
        for title, models in service.faststream.replies.items():
            _add_reply(doc, title, models)
    return doc


def _add_parameters(channel: dict[str, Any]) -> None:
    names = _PARAMETER.findall(channel["address"])
    unknown = [name for name in names if name not in PARAMETERS]
    if unknown:
        raise ValueError(f"{channel['address']}: describe {unknown} in PARAMETERS")
    if names:
        channel["parameters"] = {name: {"description": PARAMETERS[name]} for name in names}


def _add_reply(doc: dict[str, Any], title: str, models: tuple[type[Any], ...]) -> None:
    """The reply of the request/reply subscriber whose channel is `title`."""
    channels, components = doc["channels"], doc["components"]
    request = channels[title]
    reply_channel = f"{title}.reply"
    messages: dict[str, Any] = {}
    for model in models:
        name = model.__name__
        schema = TypeAdapter(model).json_schema(ref_template=_SCHEMA_REF)
        for def_name, definition in schema.pop("$defs", {}).items():
            _add_schema(components["schemas"], def_name, definition)
        _add_schema(components["schemas"], name, schema)
        key = f"{reply_channel}:{name}"
        components["messages"][key] = {
            "name": name,
            "title": key,
            "payload": {"$ref": _SCHEMA_REF.format(model=name)},
        }
        messages[name] = {"$ref": f"#/components/messages/{key}"}
    either = " or ".join(f"`{name}`" for name in messages)
    channels[reply_channel] = {
        "address": None,
        "description": (
            f"The reply to `{request['address']}`, sent to the request's reply subject "
            f"(the requester's inbox): {either}."
        ),
        "messages": messages,
    }
    operation = next(
        op for op in doc["operations"].values() if op["channel"]["$ref"] == f"#/channels/{title}"
    )
    operation["reply"] = {
        "channel": {"$ref": f"#/channels/{reply_channel}"},
        "messages": [{"$ref": f"#/channels/{reply_channel}/messages/{name}"} for name in messages],
    }


def _add_schema(schemas: dict[str, Any], name: str, schema: dict[str, Any]) -> None:
    known = schemas.setdefault(name, schema)
    if known != schema:
        raise ValueError(f"two different schemas are named {name!r}")


def render_json(doc: dict[str, Any]) -> str:
    """Stable text: sorted keys, so that the committed file is reproducible."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _ref_name(ref: str) -> str:
    """The last part of a local `$ref`, unquoted."""
    return unquote(ref.rsplit("/", 1)[-1])


def payload_names(doc: dict[str, Any], channel: dict[str, Any], refs: list[Any]) -> list[str]:
    """The schema names of the messages `refs` (of `channel`) carry."""
    names = []
    for ref in refs:
        message_ref = channel["messages"][_ref_name(ref["$ref"])]["$ref"]
        payload = doc["components"]["messages"][_ref_name(message_ref)]["payload"]
        names.append(_ref_name(payload["$ref"]))
    return names


def render_html(doc: dict[str, Any]) -> str:
    """A self-contained page (no CDN assets): operations, their replies, message schemas."""
    e = html.escape

    def links(names: list[str]) -> str:
        return " | ".join(f'<a href="#schema-{e(n)}">{e(n)}</a>' for n in names)

    rows = []
    for op_name, op in sorted(doc["operations"].items()):
        channel = doc["channels"][_ref_name(op["channel"]["$ref"])]
        reply = ""
        if "reply" in op:
            reply_channel = doc["channels"][_ref_name(op["reply"]["channel"]["$ref"])]
            reply = links(payload_names(doc, reply_channel, op["reply"]["messages"]))
        rows.append(
            f"<tr><td><code>{e(channel['address'])}</code></td><td>{e(op_name)}</td>"
            f"<td>{e(op['action'])}</td><td>{links(payload_names(doc, channel, op['messages']))}"
            f"</td><td>{reply}</td><td>{e(channel.get('description', ''))}</td></tr>"
        )
    parameters = {
        name: parameter["description"]
        for channel in doc["channels"].values()
        for name, parameter in channel.get("parameters", {}).items()
    }
    params = "\n".join(
        f"<li><code>{{{e(name)}}}</code>: {e(text)}</li>"
        for name, text in sorted(parameters.items())
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
        "<p>Generated by <code>make docs</code> from the services' FastStream applications "
        "(<code>services/asyncapi.py</code>); the full document is "
        '<a href="asyncapi.json">asyncapi.json</a>.</p>\n'
        "<h2>Operations</h2>\n<table>\n<tr><th>Subject</th><th>Operation</th>"
        "<th>Action</th><th>Message</th><th>Reply</th><th>Description</th></tr>\n"
        + "\n".join(rows)
        + f"\n</table>\n<h2>Subject parameters</h2>\n<ul>\n{params}\n</ul>\n<h2>Schemas</h2>\n"
        + "\n".join(schemas)
        + "\n</body>\n</html>\n"
    )


def render() -> dict[Path, str]:
    """Path → text of each generated file."""
    doc = document()
    return {JSON_PATH: render_json(doc), HTML_PATH: render_html(doc)}


def validate(path: Path = JSON_PATH) -> subprocess.CompletedProcess[str]:
    """Parse the document with the official AsyncAPI parser (npm `@asyncapi/parser`,
    installed into `docs/validate/node_modules` from its lock file if missing). Its
    output lists every diagnostic; the exit code is 0 when there is no error or warning."""
    if not (VALIDATOR_DIR / "node_modules" / "@asyncapi" / "parser").is_dir():
        subprocess.run(
            ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
            cwd=VALIDATOR_DIR,
            check=True,
            capture_output=True,
        )
    return subprocess.run(
        ["node", "validate.mjs", str(path)],
        cwd=VALIDATOR_DIR,
        capture_output=True,
        text=True,
        check=False,
    )


def main() -> None:
    """Write `docs/asyncapi.json` and `docs/asyncapi.html`, then check the document."""
    DOCS_DIR.mkdir(exist_ok=True)
    for path, text in render().items():
        path.write_text(text)
        sys.stdout.write(f"wrote {path}\n")
    checked = validate()
    sys.stdout.write(checked.stdout + checked.stderr)
    if checked.returncode != 0:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
