"""An attempt's abort signal: `ctx.sleep` wakes at its time, or at once on an abort."""

import asyncio

import pytest

from runwire.runners.base import AbortSignal

pytestmark = pytest.mark.unit


async def test_a_sleep_lasts_its_time_when_nothing_aborts() -> None:
    signal = AbortSignal()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await signal.sleep(0.05)
    assert loop.time() - started >= 0.045
    assert not signal.is_set()


async def test_an_abort_wakes_every_sleeper_at_once_and_later_sleeps_return_at_once() -> None:
    signal = AbortSignal()
    sleepers = [asyncio.create_task(signal.sleep(60)) for _ in range(3)]
    await asyncio.sleep(0)
    signal.set()
    await asyncio.wait_for(asyncio.gather(*sleepers), 1)
    await asyncio.wait_for(signal.sleep(60), 1)
    assert await asyncio.wait_for(signal.wait(), 1)  # still an asyncio.Event


async def test_a_cancelled_sleep_leaves_no_sleeper_behind() -> None:
    signal = AbortSignal()
    sleeper = asyncio.create_task(signal.sleep(60))
    await asyncio.sleep(0)
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    assert signal._sleepers == set()
