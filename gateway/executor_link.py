"""One Session stream to one executor, shared by every request the gateway sends there.

    gateway request threads                      the link                  executor
    submit(id, ...) ──▶ queue of updates ◀── reader thread ◀── Session stream (down)
    cancel(id)      ──▶ outbox ──────────────────────────────▶ Session stream (up)

Each request gets its own queue. The reader thread routes every RequestUpdate to its request's
queue. When the stream breaks (the executor died or went away), every request still open gets
a LinkLost in its queue, so no caller waits forever, and the link refuses new submissions.
"""
from __future__ import annotations

import logging
import queue
import threading
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
    def __init__(self, executor_id: str, channel: grpc.Channel, address: str) -> None:
        self.executor_id, self.address = executor_id, address
        self.channel = channel
        self._outbox: queue.Queue[pb.SessionRequest | None] = queue.Queue()
        self._requests: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
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
               sampling: pb.SamplingParams, cache_salt: str) -> queue.Queue:
        """Sends the request; its RequestUpdates (and a LinkLost if the stream breaks) arrive
        in the returned queue."""
        updates: queue.Queue = queue.Queue()
        with self._lock:
            if self.lost is not None:
                updates.put(LinkLost(self.lost))
                return updates
            self._requests[request_id] = updates
        self._outbox.put(pb.SessionRequest(submit=pb.SubmitRequest(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling,
            cache_salt=cache_salt)))
        return updates

    def cancel(self, request_id: str) -> None:
        """Asks the executor to stop the request; its final update still arrives."""
        with self._lock:
            if request_id not in self._requests or self.lost is not None:
                return
        self._outbox.put(pb.SessionRequest(cancel=pb.CancelRequest(request_id=request_id)))

    def forget(self, request_id: str) -> None:
        """The caller has stopped reading this request's queue."""
        with self._lock:
            self._requests.pop(request_id, None)

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()
        self._reader.join(timeout=5)
        self.channel.close()

    def _read(self) -> None:
        try:
            for response in self._call:
                for update in response.updates:
                    with self._lock:
                        updates = self._requests.get(update.request_id)
                        if update.finished:
                            self._requests.pop(update.request_id, None)
                    if updates is not None:
                        updates.put(update)
            reason = "the executor closed its stream"
        except grpc.RpcError as error:
            reason = f"the stream to executor {self.executor_id} broke: " \
                     f"{error.code().name} {error.details()}"
        with self._lock:
            self.lost = reason
            orphans, self._requests = list(self._requests.values()), {}
        if orphans:
            log.warning("%s; ending %d requests", reason, len(orphans))
        for updates in orphans:
            updates.put(LinkLost(reason))
