"""One Session stream to one executor, shared by every request the gateway sends there.

    gateway requests (event loop)                the link                  executor
    submit(id, ...) ──▶ asyncio queue ◀── loop ◀── reader thread ◀── Session stream (down)
    cancel(id)      ──▶ outbox ─────────────────────────────────────▶ Session stream (up)

Each request gets its own asyncio queue. The reader thread hands every SessionResponse (all the
updates one engine iteration made) to the event loop in one call, and the loop routes each
RequestUpdate to its request's queue: one wake-up of the loop per iteration, however many
streams are open. When the stream breaks (the executor died or went away), every request still
open gets a LinkLost in its queue, so no caller waits forever, and the link refuses new
submissions.

submit, cancel, forget and num_open belong to the event loop's thread; `alive` and close() may
be used from any thread (the directory's).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.executor.v1 import executor_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LinkLost:
    """Put in a request's queue when the stream to its executor broke."""
    message: str


class ExecutorLink:
    def __init__(self, executor_id: str, channel: grpc.Channel, address: str,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.executor_id, self.address = executor_id, address
        self.channel = channel
        self._loop = loop
        self._outbox: queue.Queue[pb.SessionRequest | None] = queue.Queue()
        self._requests: dict[str, asyncio.Queue] = {}
        self.lost: str | None = None
        self._call = pb_grpc.ExecutorStub(channel).Session(iter(self._outbox.get, None))
        self._reader = threading.Thread(target=self._read, name=f"link-{executor_id}",
                                        daemon=True)
        self._reader.start()

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
        self._outbox.put(pb.SessionRequest(submit=pb.SubmitRequest(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling,
            cache_salt=cache_salt)))
        return updates

    def cancel(self, request_id: str) -> None:
        """Asks the executor to stop the request; its final update still arrives."""
        if request_id in self._requests and self.lost is None:
            self._outbox.put(pb.SessionRequest(cancel=pb.CancelRequest(request_id=request_id)))

    def forget(self, request_id: str) -> None:
        """The caller has stopped reading this request's queue."""
        self._requests.pop(request_id, None)

    def close(self, reason: str = "the gateway closed the link") -> None:
        """Ends the stream; requests still open get a LinkLost saying `reason`."""
        # Set before the cancel, so the reader reports why rather than grpc's "CANCELLED
        # Locally cancelled by application!", and no new request is routed here meanwhile.
        if self.lost is None:
            self.lost = reason
        self._outbox.put(None)
        self._call.cancel()
        self._reader.join(timeout=5)
        self.channel.close()

    # -- the reader thread ----------------------------------------------------------------------

    def _read(self) -> None:
        try:
            for response in self._call:
                self._to_loop(self._route, response.updates)
            reason = "the executor closed its stream"
        except grpc.RpcError as error:
            reason = f"the stream to executor {self.executor_id} broke: " \
                     f"{error.code().name} {error.details()}"
        self.lost = self.lost or reason   # close() may have said why first
        self._to_loop(self._end_all, self.lost)

    def _to_loop(self, callback, argument) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, argument)
        except RuntimeError:   # the loop is closed: the gateway is gone, so are its requests
            pass

    # -- on the event loop ----------------------------------------------------------------------

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
