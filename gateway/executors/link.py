"""One Session stream to one executor, shared by every request the gateway sends there.

    gateway requests (event loop)                          executor
    submit(id, ...) ──▶ outbox ──▶ request stream (up) ──▶ Session
    per-request asyncio queue ◀── reader task ◀── response stream (down)
    cancel(id)      ──▶ outbox

The stream is a grpc.aio call on the gateway's event loop, so everything but `alive` and
close() happens on the loop's thread. Each request gets its own asyncio queue. The reader task
routes every SessionResponse (all the updates one engine iteration made) to its requests'
queues in one pass. When the stream breaks (the executor died or went away), every request
still open gets a LinkLost in its queue, so no caller waits forever, and the link refuses new
submissions.

Why the loop and not a reader thread on a synchronous channel (the first design): that took
three thread hops per engine iteration (grpc's channel thread, the reader, the loop's self-pipe
wake-up) and one more per submission (grpc's request-consuming thread); on a 2-core machine each
hop competes with the executor for a core (docs/gateway.md, "One event loop").

`alive` and close() may be used from any thread (the directory's).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc

from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.executor.v1 import executor_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
# How long a thread other than the loop's waits for the loop to open or close a link.
ON_LOOP_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class LinkLost:
    """Put in a request's queue when the stream to its executor broke."""
    message: str


class ExecutorLink:
    def __init__(self, executor_id: str, address: str,
                 open_channel: Callable[[str], grpc.aio.Channel],
                 loop: asyncio.AbstractEventLoop) -> None:
        """Opens the stream on `loop` (an aio channel belongs to the loop it was made on); from
        a thread other than the loop's, returns once it is open, or raises TimeoutError (the
        loop did not get to it) or RuntimeError (the loop is closed) with nothing opened."""
        self.executor_id, self.address = executor_id, address
        self._loop = loop
        self._requests: dict[str, asyncio.Queue] = {}
        self.lost: str | None = None
        self._open_channel = open_channel
        on_loop(loop, self._open)

    def _open(self) -> None:
        self._outbox: asyncio.Queue[pb.SessionRequest | None] = asyncio.Queue()
        self._channel = self._open_channel(self.address)
        self._call = pb_grpc.ExecutorStub(self._channel).Session(self._outgoing())
        self._reader = self._loop.create_task(self._read(), name=f"link-{self.executor_id}")

    @property
    def alive(self) -> bool:
        return self.lost is None

    @property
    def num_open(self) -> int:
        """Requests this gateway has open on the executor: fresher than its heartbeats."""
        return len(self._requests)

    def submit(self, request_id: str, prompt_token_ids: list[int],
               sampling: pb.SamplingParams, cache_salt: str) -> asyncio.Queue:
        """Sends the request; its RequestUpdates (and a LinkLost if the stream breaks) arrive
        in the returned queue."""
        updates: asyncio.Queue = asyncio.Queue()
        if self.lost is not None:
            updates.put_nowait(LinkLost(self.lost))
            return updates
        self._requests[request_id] = updates
        self._outbox.put_nowait(pb.SessionRequest(submit=pb.SubmitRequest(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling,
            cache_salt=cache_salt)))
        return updates

    def cancel(self, request_id: str) -> None:
        """Asks the executor to stop the request; its final update still arrives."""
        if request_id in self._requests and self.lost is None:
            self._outbox.put_nowait(pb.SessionRequest(
                cancel=pb.CancelRequest(request_id=request_id)))

    def forget(self, request_id: str) -> None:
        """The caller has stopped reading this request's queue."""
        self._requests.pop(request_id, None)

    def close(self, reason: str = "the gateway closed the link") -> None:
        """Ends the stream; requests still open get a LinkLost saying `reason`. From a thread
        other than the loop's, returns once the stream is down."""
        # Set before the cancel, so the reader reports why rather than grpc's "CANCELLED",
        # and no new request is routed here meanwhile.
        if self.lost is None:
            self.lost = reason
        try:
            on_loop(self._loop, self._close)
        except (RuntimeError, TimeoutError):
            pass   # the loop is closed or stopped: the gateway is going away, its requests too

    def _close(self) -> None:
        self._outbox.put_nowait(None)
        # The reader closes the channel once it has seen the stream end.
        self._call.cancel()

    async def _outgoing(self) -> AsyncIterator[pb.SessionRequest]:
        while (message := await self._outbox.get()) is not None:
            yield message

    async def _read(self) -> None:
        try:
            async for response in self._call:
                self._route(response.updates)
            reason = "the executor closed its stream"
        except asyncio.CancelledError:   # how grpc.aio ends a call that close() cancelled
            reason = "the gateway closed the link"
        except grpc.RpcError as error:
            reason = f"the stream to executor {self.executor_id} broke: " \
                     f"{error.code().name} {error.details()}"
        self.lost = self.lost or reason   # close() may have said why first
        self._end_all(self.lost)
        await self._channel.close()

    def _route(self, updates: Sequence[pb.RequestUpdate]) -> None:
        for update in updates:
            if update.finished:
                waiting = self._requests.pop(update.request_id, None)
            else:
                waiting = self._requests.get(update.request_id)
            if waiting is not None:
                waiting.put_nowait(update)

    def _end_all(self, reason: str) -> None:
        orphans, self._requests = list(self._requests.values()), {}
        if orphans:
            log.warning("%s; ending %d requests", reason, len(orphans))
        for waiting in orphans:
            waiting.put_nowait(LinkLost(reason))


def on_loop(loop: asyncio.AbstractEventLoop, work: Callable[[], None]) -> None:
    """Runs `work` on `loop`'s thread: at once when called there, else through the loop,
    waiting for it. RuntimeError when the loop is closed; TimeoutError when it did not run
    `work` in time, which then never runs."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        work()
        return

    async def run() -> None:
        work()

    done = asyncio.run_coroutine_threadsafe(run(), loop)
    try:
        done.result(timeout=ON_LOOP_TIMEOUT_S)
    except TimeoutError:
        done.cancel()
        raise
