"""Bounded admission: running and queued limits, refusal beyond them, first come first served,
and a waiter whose client goes away (its task cancelled) leaves no trace."""
from __future__ import annotations

import asyncio

import pytest

from gateway.admission import Admission
from pagedserve.common.errors import ResourceExhausted


async def settle() -> None:
    """Lets every ready task run until it waits again."""
    for _ in range(5):
        await asyncio.sleep(0)


async def hold(admission: Admission, release: asyncio.Event, order: list, index: int) -> None:
    try:
        async with admission.slot():
            order.append(index)
            await release.wait()
    except ResourceExhausted as error:
        order.append(type(error).__name__)


def test_beyond_running_and_queued_limits_a_request_is_refused_at_once():
    async def scenario() -> None:
        admission, release, order = Admission(max_running=1, max_queued=2), asyncio.Event(), []
        tasks = [asyncio.create_task(hold(admission, release, order, 0))]
        await settle()
        assert admission.running == 1
        tasks += [asyncio.create_task(hold(admission, release, order, i)) for i in (1, 2)]
        await settle()
        assert admission.queued == 2
        with pytest.raises(ResourceExhausted, match="1 requests running and 2 queued"):
            async with admission.slot():
                pass
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert order == [0, 1, 2]            # queued ones ran in arrival order
        assert (admission.running, admission.queued) == (0, 0)

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_queue_and_the_next_one_gets_the_slot():
    async def scenario() -> None:
        admission, release, order = Admission(max_running=1, max_queued=4), asyncio.Event(), []
        first = asyncio.create_task(hold(admission, release, order, 0))
        await settle()
        leaving = asyncio.create_task(hold(admission, release, order, 1))
        staying = asyncio.create_task(hold(admission, release, order, 2))
        await settle()
        assert admission.queued == 2
        leaving.cancel()
        await settle()
        assert leaving.cancelled() and admission.queued == 1
        release.set()
        await asyncio.wait_for(asyncio.gather(first, staying), 5)
        assert order == [0, 2]
        assert (admission.running, admission.queued) == (0, 0)

    asyncio.run(scenario())


def test_a_waiter_cancelled_just_as_it_is_handed_the_slot_gives_it_back():
    async def scenario() -> None:
        admission, release, order = Admission(max_running=1, max_queued=4), asyncio.Event(), []
        async with admission.slot():
            waiter = asyncio.create_task(hold(admission, release, order, 1))
            await settle()
            assert admission.queued == 1
        waiter.cancel()             # the slot was handed over; the waiter has not run since
        await asyncio.gather(waiter, return_exceptions=True)
        assert waiter.cancelled() and order == []
        assert (admission.running, admission.queued) == (0, 0)

    asyncio.run(scenario())
