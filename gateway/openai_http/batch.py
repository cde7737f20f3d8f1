"""A batched completions request (`"prompt": [p0, p1, ...]`) as one stream of GenerationEvents.

Each prompt is generated as a request of its own, all at once, so the executors batch them like
any concurrent requests and the prefix cache shares what they have in common. Their events are
merged as they arrive: prompt i's choice j becomes choice i * n + j, as OpenAI numbers a batch's
choices; the usage, which each prompt's last event carries, is summed onto the merged stream's
last event. A prompt that fails ends the whole stream with its error, and closing the merged
stream closes every prompt's (their executor requests are cancelled).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import replace

from gateway.generation import GenerationEvent, Usage

_DONE = object()


async def merged(streams: Sequence[AsyncIterator[GenerationEvent]], n: int
                 ) -> AsyncIterator[GenerationEvent]:
    """The events of `streams` (one per prompt, each numbering its choices 0..n-1) as one."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for event in only:
                yield event
        return
    queue: asyncio.Queue = asyncio.Queue()
    pumps = [asyncio.create_task(_pump(stream, prompt, queue))
             for prompt, stream in enumerate(streams)]
    usages: list[Usage] = []
    try:
        open_streams = len(pumps)
        while open_streams:
            prompt, item = await queue.get()
            if item is _DONE:
                open_streams -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            if item.usage is not None:
                usages.append(item.usage)
            event = replace(item, usage=None, prompt_index=prompt, choices=[
                replace(delta, index=prompt * n + delta.index) for delta in item.choices])
            if event.choices or event.model:
                yield event
        yield GenerationEvent(usage=_sum(usages))
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _pump(stream: AsyncIterator[GenerationEvent], prompt: int, queue: asyncio.Queue
                ) -> None:
    # aclosing: a pump cancelled mid-stream closes its generator, which cancels the request.
    async with aclosing(stream):
        try:
            async for event in stream:
                await queue.put((prompt, event))
        except Exception as error:  # noqa: BLE001 - handed to the merger, which raises it
            await queue.put((prompt, error))
            return
    await queue.put((prompt, _DONE))


def _sum(usages: list[Usage]) -> Usage | None:
    if not usages:
        return None
    return Usage(prompt_tokens=sum(u.prompt_tokens for u in usages),
                 completion_tokens=sum(u.completion_tokens for u in usages),
                 cached_tokens=sum(u.cached_tokens for u in usages))
