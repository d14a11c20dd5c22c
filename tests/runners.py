"""Runners that tests register the way users do: declared with `runwire.runner`, found
through `RUNWIRE_RUNNERS` or handed to the stack in code."""

import asyncio
from typing import Any

from pydantic import Field

import runwire
from runwire.contracts.base import WireModel
from runwire.contracts.frames import FrameType


class EchoInput(WireModel):
    """What `echo` takes: a text, said back in `times` frames."""

    text: str = Field(min_length=1)
    times: int = Field(default=1, ge=1, le=100)


@runwire.runner(input=EchoInput)
async def echo(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Say the text back, once per `times`; the result names the executor's runner."""
    args = EchoInput.model_validate(ctx.input)
    for _ in range(args.times):
        await ctx.message(args.text)
    return {"echoed": args.times}


@runwire.runner(input=EchoInput)
async def gathers(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Say every input's text in one frame: a coalesced run's `inputs`, or its one input."""
    inputs = ctx.input.get("inputs", [ctx.input])
    await ctx.message(" + ".join(str(i["text"]) for i in inputs))
    return {"inputs": len(inputs)}


# Attempts of `slow` that run right now, in this process (the test reads it).
SLOW_RUNNING: list[str] = []
SLOW_MOST = [0]


@runwire.runner(max_in_flight=2)
async def slow(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Hold the attempt for `ms` milliseconds; counts how many hold one at once."""
    SLOW_RUNNING.append(ctx.run_id)
    SLOW_MOST[0] = max(SLOW_MOST[0], len(SLOW_RUNNING))
    try:
        await asyncio.sleep(int(ctx.input.get("ms", 200)) / 1000)
    finally:
        SLOW_RUNNING.remove(ctx.run_id)
    return {}


async def plain(ctx: runwire.AttemptContext) -> None:
    """An undeclared runner: any input object."""
    await ctx.message(str(sorted(ctx.input)))


NOT_A_RUNNER = "a string"


class ChargeInput(WireModel):
    """What `charge` takes: where to charge and how much."""

    url: str
    # Where the charge's outcome can be asked for; without it nothing can be reconciled.
    status_url: str | None = None
    amount: int = Field(ge=1)
    # Fail this attempt (retryably) after the charge: the next must not charge again.
    fail_after_charge_on_attempt: int = 0
    # Cost units the charge reserves from the budgets before it is dispatched.
    cost: int = Field(default=0, ge=0)
    # Wait for GATES[gate] to be set before the charge (the test decides when).
    gate: str | None = None


# Events the `charge` runner waits on before charging, by name (tests set them).
GATES: dict[str, asyncio.Event] = {}


@runwire.runner(input=ChargeInput)
async def charge(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Charge once through the `http` effect adapter, then say so."""
    args = ChargeInput.model_validate(ctx.input)
    request: dict[str, Any] = {"url": args.url, "body": {"amount": args.amount}}
    if args.status_url is not None:
        request["status_url"] = args.status_url
    if args.gate is not None:
        await GATES[args.gate].wait()
    receipt = await ctx.effect("http", "charge", request, cost=args.cost)
    if ctx.attempt == args.fail_after_charge_on_attempt:
        raise runwire.RunnerError("failing after the charge, as asked", retryable=True)
    await ctx.message(f"charged {args.amount} as {receipt['id']}")
    return {"receipt": receipt["id"]}


class SpendInput(WireModel):
    """What `spend` takes: tokens to reserve, then to settle as used."""

    reserve: int = Field(ge=0)
    use: int = Field(ge=0)
    hold_ms: int = Field(default=50, ge=0)
    # Cost units reserved and used, beside the tokens.
    reserve_cost: int = Field(default=0, ge=0)
    use_cost: int = Field(default=0, ge=0)


@runwire.runner(input=SpendInput)
async def spend(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Reserve budget for a costly call, hold it a while, settle what the call used."""
    args = SpendInput.model_validate(ctx.input)
    await ctx.reserve("call", args.reserve, cost=args.reserve_cost)
    await ctx.sleep(args.hold_ms / 1000)
    receipt = f"usage-{ctx.run_id}-{ctx.attempt}"
    await ctx.settle("call", args.use, receipt, cost=args.use_cost)
    await ctx.message(f"spent {args.use}")
    return {"spent": args.use}


class EmailArgs(WireModel):
    """The arguments of the `send_email` tool."""

    to: str = Field(min_length=3)
    subject: str
    body: str = ""


# Where `send_email` sends: the URL of a test's mail endpoint (set by the test), and
# whether it gives the endpoint's status URL (so an email can be reconciled).
MAIL_API = {"url": "", "status": ""}


@runwire.tool(input=EmailArgs)
async def send_email(args: EmailArgs, ctx: runwire.ToolContext) -> dict[str, Any]:
    """Send an email; once per call, whatever crashes."""
    request: dict[str, Any] = {"url": f"{MAIL_API['url']}/email", "body": args.model_dump()}
    if MAIL_API["status"]:
        request["status_url"] = f"{MAIL_API['url']}/emails/{{idempotency_key}}"
    receipt = await ctx.effect("http", "email", request, cost=1)
    return {"sent": receipt["id"]}


class MailerInput(WireModel):
    """What `mailer` takes: whom to greet, under which call ids."""

    to: str
    calls: list[str] = Field(min_length=1)
    # Fail this attempt (retryably) after the calls: the next makes them again.
    fail_on_attempt: int = 0


@runwire.runner(input=MailerInput)
async def mailer(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Call the `send_email` tool once per call id, and say what each call gave."""
    args = MailerInput.model_validate(ctx.input)
    sent = []
    for call_id in args.calls:
        outcome = await ctx.call_tool(
            "send_email", {"to": args.to, "subject": f"hello ({call_id})"}, call_id=call_id
        )
        sent.append(outcome.output["sent"] if outcome.error is None else outcome.error)
    if ctx.attempt == args.fail_on_attempt:
        raise runwire.RunnerError("failing after the emails, as asked", retryable=True)
    await ctx.message(" ".join(sent))
    return {"sent": sent}


# Text no Postgres column can hold: a NUL character, and half of a UTF-16 surrogate pair.
NUL_TEXT = "before\x00after"
SURROGATE_TEXT = "half \ud800 a pair"


@runwire.runner()
async def unstorable(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Emit what a model's output, a tool's result or a runner's own text may hold but
    Postgres cannot store (a submitted input cannot: the submitter refuses it), in a
    text delta, a status frame and the result."""
    await ctx.message(NUL_TEXT)
    await ctx.emit(FrameType.STATUS, {"status": "thinking\x00"})
    await ctx.message(SURROGATE_TEXT)
    return {"note": NUL_TEXT}


# A credential that a failing library puts in its exception's text (a DSN, a key in a
# URL): no client may read it.
FAKE_SECRET = "sk-live-7f3a9c01d2e4b5a6"


class NoArgs(WireModel):
    """A tool that takes nothing."""


@runwire.tool(input=NoArgs)
async def leaky_tool(args: NoArgs) -> dict[str, Any]:
    """Fail as an HTTP client does, with the request's URL (and its key) in the text."""
    raise ConnectionError(f"GET https://api.example.com/v1/search?key={FAKE_SECRET} failed")


@runwire.runner()
async def leaky(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Fail with a credential in the exception's text: raised by a library (`crash`),
    by a tool (`tool`), or a RunnerError in the runner author's own words (`own`)."""
    how = ctx.input.get("how", "crash")
    if how == "tool":
        outcome = await ctx.call_tool("leaky_tool", {})
        await ctx.message(f"the tool said: {outcome.error}")
        return {}
    if how == "own":
        raise runwire.RunnerError("the search index is not ready", retryable=False)
    raise ValueError(f"cannot connect to postgresql://app:{FAKE_SECRET}@db.internal/prod")
