"""A tenant's JetStream API: the official NATS clients' own ways of following a run
(ordered consumers, a stream looked up by subject, a subject's last message), on the
tenant's own runs' frames and events, each request checked before the server sees it.

A tenant's clients use `<prefix>.<tenant>.JS.API` as their JetStream API prefix (nats-py
`nc.jetstream(prefix=...)`, nats.js `jetstream(nc, {apiPrefix})`, Go
`jetstream.NewWithAPIPrefix`). The broker lets a tenant publish there and nowhere under
`$JS.API`: the server's API takes no filter or deliver subject from a permission, so a
tenant's request there could read every tenant's frames or deliver into any subject.
The submitter answers the prefix in its queue group:

- `INFO` (the account's): the number of those streams, and no usage (answered here).
- `STREAM.NAMES`: the frames and events streams, those of them that store a subject
  the request names (answered here).
- `STREAM.INFO.<stream>`: the stream's configuration with its subjects narrowed to the
  tenant's, without its counts, the other tenants' subjects or where it is placed
  (answered here; the stream is shared, so its totals are everyone's).
- `CONSUMER.CREATE.<stream>[.<name>[.<filter>]]`: a consumer filtered to the tenant's
  own subjects, ephemeral, unacknowledged (`ack_policy` none: a tenant's client sends
  no acknowledgements), delivering (if a push consumer) into the tenant's inbox, gone
  within `tenant_consumer_max_inactive_ms` of its client; made with the `create`
  action (never an update of a consumer of that name).
- `CONSUMER.INFO`, `CONSUMER.DELETE`, `CONSUMER.MSG.NEXT` `.<stream>.<name>`: on a
  consumer filtered to the tenant's subjects only (any other is "not found").
- `DIRECT.GET.<stream>.<subject>` and `DIRECT.GET.<stream>` / `STREAM.MSG.GET.<stream>`
  by `last_by_subj`, `next_by_subj` or `multi_last`: messages of the tenant's subjects
  only (never by a bare stream sequence).

Anything else is refused (403). An allowed request goes on to `$JS.API` with the
requester's reply subject, so the server answers the client itself (a pull's messages
too); the reply subject must lie in the tenant's inbox, as a command's must. Recovery
still watches every consumer of the streams (its rules and the per-tenant count).
"""

import asyncio
import json
import logging
import time
from dataclasses import fields as dataclass_fields
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig

from runwire.contracts.subjects import Subjects, reply_inboxes, valid_tenant
from runwire.runtime.broker import Broker
from runwire.runtime.logs import fields
from runwire.runtime.metrics import COMMANDS_REFUSED
from runwire.runtime.settings import SubmitterSettings

log = logging.getLogger(__name__)

API = "$JS.API"
# The largest request body looked at: the clients' requests are a few hundred bytes.
MAX_REQUEST_BYTES = 64 * 1024
# Requests handled at once; more wait in the connection's buffer.
WORKERS = 256
# How long the server's own answer (a consumer's or a stream's information) is waited for.
SERVER_TIMEOUT_S = 5.0
# How long a stream's configuration is kept before it is read again.
STREAM_INFO_TTL_S = 10.0
# What a consumer's configuration may hold: the fields the clients know.
CONSUMER_FIELDS = frozenset(f.name for f in dataclass_fields(ConsumerConfig))
# What a stream's configuration shows a tenant.
STREAM_CONFIG_SHOWN = (
    "name",
    "description",
    "retention",
    "max_consumers",
    "max_msgs",
    "max_bytes",
    "max_age",
    "max_msgs_per_subject",
    "max_msg_size",
    "discard",
    "storage",
    "num_replicas",
    "duplicate_window",
    "allow_direct",
    "allow_rollup_hdrs",
    "deny_delete",
    "deny_purge",
    "sealed",
)


class Refused(Exception):
    """A request the tenant may not make: answered as the server answers an API error."""

    def __init__(self, code: int, description: str, err_code: int = 0) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.err_code = err_code


def _not_found() -> Refused:
    return Refused(404, "consumer not found", 10014)


def _error(exc: Refused) -> bytes:
    error: dict[str, Any] = {"code": exc.code, "description": exc.description}
    if exc.err_code:
        error["err_code"] = exc.err_code
    return json.dumps({"type": "io.nats.jetstream.api.v1.error", "error": error}).encode()


def intersects(a: str, b: str) -> bool:
    """Whether two subjects (wildcards allowed) have a subject in common."""
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        if i >= len(ta) or i >= len(tb):
            return False
        x, y = ta[i], tb[i]
        if ">" in (x, y):
            return True
        if x != y and "*" not in (x, y):
            return False
    return True


class TenantJetStream:
    """The submitter's answer to tenants' JetStream API requests (see the module)."""

    def __init__(self, settings: SubmitterSettings, broker: Broker, queue: str) -> None:
        self.broker = broker
        self.subjects: Subjects = broker.subjects
        self.queue = queue
        self.max_inactive_s = settings.tenant_consumer_max_inactive_ms / 1000
        self._sub: Subscription | None = None
        self._slots = asyncio.Semaphore(WORKERS)
        self._tasks: set[asyncio.Task[None]] = set()
        self._stream_info: dict[str, tuple[float, dict[str, Any]]] = {}

    async def start(self) -> None:
        self._sub = await self.broker.nc.subscribe(
            self.subjects.jetstream_api("*") + ".>", queue=self.queue, cb=self._take
        )

    async def stop(self) -> None:
        """Stop taking requests and answer those taken."""
        if self._sub is not None:
            try:
                await self._sub.drain()  # type: ignore[no-untyped-call]  # nats-py's
            except nats.errors.Error as exc:
                log.warning("tenants' JetStream requests not drained (%s)", exc)
            self._sub = None
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=SERVER_TIMEOUT_S)

    async def _take(self, msg: Msg) -> None:
        await self._slots.acquire()
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        self._slots.release()

    # -- one request ----------------------------------------------------------------
    async def _answer(self, msg: Msg) -> None:
        tokens = msg.subject.split(".")
        tenant, api = tokens[1], tokens[4:]
        reply = msg.reply
        if not reply or not valid_tenant(tenant) or not reply.startswith(reply_inboxes(tenant)):
            # The reply subject is the requester's choice: the server would answer there.
            log.warning(
                "a tenant's JetStream request refused: its reply subject is outside the "
                "tenant's inbox",
                extra=fields(tenant=tenant, reply_to=(reply or "")[:200]),
            )
            COMMANDS_REFUSED.labels("jetstream").inc()
            return
        try:
            if len(msg.data) > MAX_REQUEST_BYTES:
                raise Refused(400, f"a request of {len(msg.data)} bytes is over the limit")
            answer = await self._route(tenant, api, msg)
        except Refused as exc:
            answer = _error(exc)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            log.warning("a tenant's JetStream request failed: %s", exc, extra=fields(tenant=tenant))
            answer = _error(Refused(503, "JetStream did not answer; try again"))
        if answer is not None:
            await self._publish(reply, answer)

    async def _publish(self, subject: str, body: bytes, reply: str = "") -> None:
        try:
            await self.broker.nc.publish(subject, body, reply=reply)
        except (nats.errors.Error, OSError) as exc:
            log.warning("a tenant's JetStream request not passed on: %s", exc)

    async def _route(self, tenant: str, api: list[str], msg: Msg) -> bytes | None:
        """The answer to send the requester, or None once the request went on to the
        server (which answers it)."""
        kind = ".".join(api[:2])
        rest = api[2:]
        if api == ["INFO"]:
            return self._account_info(tenant)
        if kind == "STREAM.NAMES" and not rest:
            return self._stream_names(tenant, _body(msg.data))
        if kind == "STREAM.INFO" and len(rest) == 1:
            return await self._stream_info_of(tenant, self._stream(rest[0]))
        if kind == "CONSUMER.CREATE" and rest:
            return await self._create(tenant, api, _body(msg.data), msg.reply)
        if kind in ("CONSUMER.INFO", "CONSUMER.DELETE") and len(rest) == 2:
            return await self._on_consumer(tenant, api, msg)
        if api[:3] == ["CONSUMER", "MSG", "NEXT"] and len(api) == 5:
            return await self._on_consumer(tenant, api, msg)
        if kind == "DIRECT.GET" and len(rest) > 1:
            stream = self._stream(rest[0])
            self._own(tenant, stream, ".".join(rest[1:]), wildcards=False)
            await self._forward(api, b"", msg.reply)
            return None
        if kind in ("DIRECT.GET", "STREAM.MSG") and rest:
            if kind == "STREAM.MSG" and (rest[0] != "GET" or len(rest) != 2):
                raise Refused(403, f"{'.'.join(api)} is not open to a tenant")
            stream = self._stream(rest[-1])
            self._get_by_subject(tenant, stream, _body(msg.data))
            await self._forward(api, msg.data, msg.reply)
            return None
        raise Refused(403, f"{'.'.join(api) or 'that'} is not open to a tenant")

    # -- streams --------------------------------------------------------------------
    def _streams(self, tenant: str) -> dict[str, str]:
        """The streams a tenant reads, each with the subjects of its own it stores."""
        s = self.subjects
        return {
            s.run_frames_stream: s.run_frames(tenant, "*"),
            s.events_stream: s.events(tenant, "*"),
        }

    def _account_info(self, tenant: str) -> bytes:
        """What the clients ask first to see that JetStream is there (nats.js's manager):
        the streams the tenant reads, and no usage (the account is every tenant's)."""
        return json.dumps(
            {
                "type": "io.nats.jetstream.api.v1.account_info_response",
                "memory": 0,
                "storage": 0,
                "streams": len(self._streams(tenant)),
                "consumers": 0,
                "limits": {
                    "max_memory": -1,
                    "max_storage": -1,
                    "max_streams": -1,
                    "max_consumers": -1,
                    "max_ack_pending": -1,
                    "memory_max_stream_bytes": -1,
                    "storage_max_stream_bytes": -1,
                    "max_bytes_required": False,
                },
                "api": {"total": 0, "errors": 0},
            }
        ).encode()

    def _stream(self, name: str) -> str:
        if name not in (self.subjects.run_frames_stream, self.subjects.events_stream):
            raise Refused(404, "stream not found", 10059)
        return name

    def _stream_names(self, tenant: str, body: dict[str, Any]) -> bytes:
        subject = body.get("subject")
        if subject is not None and not isinstance(subject, str):
            raise Refused(400, "subject must be a string")
        names = [
            name
            for name, own in self._streams(tenant).items()
            if subject is None or intersects(subject, own)
        ]
        return json.dumps(
            {
                "type": "io.nats.jetstream.api.v1.stream_names_response",
                "total": len(names),
                "offset": 0,
                "limit": 1024,
                "streams": names,
            }
        ).encode()

    async def _stream_info_of(self, tenant: str, stream: str) -> bytes:
        kept = self._stream_info.get(stream)
        if kept is None or time.monotonic() - kept[0] > STREAM_INFO_TTL_S:
            info = await self._server(f"{API}.STREAM.INFO.{stream}")
            kept = (time.monotonic(), info)
            self._stream_info[stream] = kept
        info = kept[1]
        config = {k: v for k, v in info.get("config", {}).items() if k in STREAM_CONFIG_SHOWN}
        config["subjects"] = [self._streams(tenant)[stream]]
        shown = {
            "type": "io.nats.jetstream.api.v1.stream_info_response",
            "config": config,
            "created": info.get("created"),
            # Shared by every tenant: its counts are not this tenant's to see.
            "state": {
                "messages": 0,
                "bytes": 0,
                "first_seq": 0,
                "last_seq": 0,
                "consumer_count": 0,
            },
        }
        return json.dumps(shown).encode()

    def _own(self, tenant: str, stream: str, subject: Any, *, wildcards: bool) -> None:
        """Refuse unless `subject` is one of the tenant's subjects the stream stores."""
        if not isinstance(subject, str) or not subject:
            raise Refused(400, "a subject of the tenant's runs is required")
        own = self._streams(tenant)[stream]
        tokens = subject.split(".")
        fixed = own.split(".")[:3]
        if tokens[:3] != fixed or not intersects(subject, own):
            raise Refused(403, f"{subject!r} is not a subject of the tenant's runs")
        if not wildcards and ("*" in tokens or ">" in tokens):
            raise Refused(400, f"{subject!r} has a wildcard")

    def _get_by_subject(self, tenant: str, stream: str, body: dict[str, Any]) -> None:
        """Refuse a read of stored messages unless it names the tenant's subjects."""
        by = [k for k in ("last_by_subj", "next_by_subj", "multi_last") if k in body]
        if len(by) != 1:
            raise Refused(403, "a tenant reads stored messages by its own subject only")
        if by[0] == "multi_last":
            subjects = body["multi_last"]
            if not isinstance(subjects, list) or not subjects:
                raise Refused(400, "multi_last must be a list of subjects")
            for subject in subjects:
                self._own(tenant, stream, subject, wildcards=True)
        else:
            self._own(tenant, stream, body[by[0]], wildcards=by[0] == "next_by_subj")

    # -- consumers ------------------------------------------------------------------
    async def _create(
        self, tenant: str, api: list[str], body: dict[str, Any], reply: str
    ) -> bytes | None:
        stream = self._stream(api[2])
        config = body.get("config")
        if not isinstance(config, dict):
            raise Refused(400, "the request has no consumer configuration")
        unknown = sorted(set(config) - CONSUMER_FIELDS)
        if unknown:
            raise Refused(400, f"unknown consumer settings: {', '.join(unknown)}")
        filters = [config["filter_subject"]] if config.get("filter_subject") else []
        extra = config.get("filter_subjects") or []
        if not isinstance(extra, list):
            raise Refused(400, "filter_subjects must be a list")
        filters += extra
        if not filters:
            raise Refused(403, "a tenant's consumer is filtered to its runs' subjects")
        for subject in filters:
            self._own(tenant, stream, subject, wildcards=True)
        self._check(tenant, config)
        if config.get("name"):
            # A consumer of that name already there is not changed: it may not be the
            # tenant's.
            body = {**body, "action": "create"}
        await self._forward(api, json.dumps(body).encode(), reply)
        return None

    def _check(self, tenant: str, config: dict[str, Any]) -> None:
        if config.get("durable_name"):
            raise Refused(403, "a tenant's consumers are ephemeral (no durable_name)")
        if config.get("ack_policy", "none") != "none":
            raise Refused(403, "a tenant's consumers are not acknowledged: set ack_policy to none")
        deliver = config.get("deliver_subject")
        if deliver is not None and (
            not isinstance(deliver, str) or not deliver.startswith(reply_inboxes(tenant))
        ):
            raise Refused(403, "a tenant's consumer delivers into the tenant's inbox only")
        inactive = config.get("inactive_threshold")
        if inactive is not None:
            if not isinstance(inactive, int) or inactive < 0:
                raise Refused(400, "inactive_threshold must be a number of nanoseconds")
            if inactive / 1e9 > self.max_inactive_s:
                raise Refused(
                    403,
                    f"a tenant's consumer goes at most {self.max_inactive_s:g}s after its "
                    "client stops reading (inactive_threshold)",
                )

    async def _on_consumer(self, tenant: str, api: list[str], msg: Msg) -> bytes | None:
        stream, name = self._stream(api[-2]), api[-1]
        try:
            info = await self._server(f"{API}.CONSUMER.INFO.{stream}.{name}")
        except Refused as exc:
            if exc.code == 404:
                raise _not_found() from None
            raise
        config = ConsumerConfig.from_response(dict(info.get("config", {})))
        filters = [config.filter_subject] if config.filter_subject else []
        filters += config.filter_subjects or []
        try:
            if not filters:
                raise _not_found()
            for subject in filters:
                self._own(tenant, stream, subject, wildcards=True)
        except Refused:
            raise _not_found() from None
        if api[1] == "INFO":
            info.pop("cluster", None)  # where it is placed is the infrastructure's
            return json.dumps(info).encode()
        await self._forward(api, msg.data, msg.reply)
        return None

    # -- the server -----------------------------------------------------------------
    async def _forward(self, api: list[str], body: bytes, reply: str) -> None:
        """The request on to the server's API, answered to the requester."""
        await self._publish(f"{API}.{'.'.join(api)}", body, reply)

    async def _server(self, subject: str) -> dict[str, Any]:
        """The server's own answer to one of the submitter's requests."""
        answer = await self.broker.nc.request(subject, b"", timeout=SERVER_TIMEOUT_S)
        data = json.loads(answer.data)
        error = data.get("error")
        if error:
            raise Refused(int(error.get("code", 500)), str(error.get("description", "")))
        result: dict[str, Any] = data
        return result


def _body(data: bytes) -> dict[str, Any]:
    if not data.strip():
        return {}
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise Refused(400, "the request is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "the request must be a JSON object")
    return body
