"""Feeds a blocking event stream to asyncio: the HTTP layer is async (uvicorn), the Generator is
plain threads and queues, like the gRPC layer that shares it.

    pump = EventPump(lambda gone: generator.generate(request, gone), loop)
    async for event in pump: ...        # raises what the stream raised
    pump.cancel()                       # the client went away: the stream is closed

Each request's stream runs on its own thread rather than a pool's: a stream lives for the whole
generation, and a pool of N threads would quietly cap concurrent requests at N, below the
admission limits that are meant to do that with a clear error.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from typing import Any

_END = object()


class EventPump:
    def __init__(self, open_stream: Callable[[Callable[[], bool]], Generator[Any, None, None]],
                 loop: asyncio.AbstractEventLoop, name: str = "http-request") -> None:
        """`open_stream(cancelled)` makes the blocking stream; it should poll `cancelled`."""
        self._open_stream = open_stream
        self._loop = loop
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self._gone = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        self._gone.set()

    def __aiter__(self) -> EventPump:
        return self

    async def __anext__(self) -> Any:
        item = await self._items.get()
        if item is _END:
            self._items.put_nowait(_END)   # stays ended for any later call
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._items.put_nowait(_END)
            raise item
        return item

    def _run(self) -> None:
        stream = None
        try:
            stream = self._open_stream(self._gone.is_set)
            for item in stream:
                if self._gone.is_set():
                    break
                self._deliver(item)
            self._deliver(_END)
        except Exception as error:  # noqa: BLE001 - handed to the awaiting side to map
            self._deliver(error)
        finally:
            if stream is not None:
                stream.close()   # cancels the executor request when we stopped early

    def _deliver(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:   # the event loop is closed: the server is gone, so is the client
            self._gone.set()
