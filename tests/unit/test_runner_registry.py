"""Declaring and naming runners: what is refused, and with what reason (pure logic)."""

import pytest
from pydantic import BaseModel

import runwire
from runwire.runners.registry import RunnerConfigError, load_runners, parse_setting
from tests.runners import echo, plain

pytestmark = pytest.mark.unit


def test_the_setting_names_runners_and_refuses_what_it_cannot_read() -> None:
    assert parse_setting(" a=pkg.mod:obj , b-2=pkg:x.y ,") == {"a": "pkg.mod:obj", "b-2": "pkg:x.y"}
    with pytest.raises(RunnerConfigError, match="named twice"):
        parse_setting("a=pkg:x,a=pkg:y")
    with pytest.raises(RunnerConfigError, match=r"expected name=package\.module:object"):
        parse_setting("a=pkg.x")


def test_installed_runners_include_scripted_and_code_given_ones_win() -> None:
    runners = load_runners("echo=tests.runners:echo", {"plain": plain})
    assert {"scripted", "echo", "plain"} <= runners.keys()
    assert runners["echo"] is echo
    assert runners["plain"].input_model is None
    assert runners["scripted"].input_model is not None


def test_a_declaration_checks_what_it_is_given() -> None:
    class Model(BaseModel):
        x: int

    with pytest.raises(TypeError, match="pydantic model"):
        runwire.runner(input=dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1"):
        runwire.runner(max_in_flight=0)

    def not_async(ctx: runwire.AttemptContext) -> None: ...

    with pytest.raises(TypeError, match="not an async function"):
        runwire.runner(input=Model)(not_async)  # type: ignore[arg-type]
    with pytest.raises(RunnerConfigError, match="is int, not a runner"):
        load_runners(extra={"x": 3})


async def test_the_openai_runner_without_a_key_for_the_openai_api_fails_at_once() -> None:
    import asyncio

    from runwire.runners.base import AttemptContext
    from runwire.runners.openai_chat import OpenAISettings, make_runner

    spec = make_runner(OpenAISettings(base_url="https://api.openai.com/v1", api_key=None))

    async def nothing(*_: object) -> None: ...

    ctx = AttemptContext(
        run_id="r",
        tenant="t",
        input={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        attempt=1,
        resumed=False,
        continuation="",
        checkpoint_state=None,
        history=[],
        abort=asyncio.Event(),
        _emit=nothing,
        _checkpoint=nothing,
    )
    with pytest.raises(runwire.RunnerError) as failed:
        await spec(ctx)
    assert failed.value.retryable is False
    assert "RUNWIRE_OPENAI_API_KEY" in failed.value.message


def test_a_tool_takes_its_arguments_and_optionally_a_context() -> None:
    class Args(BaseModel):
        n: int

    @runwire.tool(input=Args)
    async def plain_tool(args: Args) -> int:
        return args.n

    @runwire.tool(input=Args)
    async def with_context(args: Args, ctx: runwire.ToolContext) -> str:
        return ctx.call_id

    assert (plain_tool.takes_context, with_context.takes_context) == (False, True)
    with pytest.raises(TypeError, match="it takes 3 positional parameters"):

        @runwire.tool(input=Args)
        async def too_many(args: Args, ctx: runwire.ToolContext, extra: int) -> None:
            return None
