"""A Session stream to a real executor process, driven from the test thread, and the token ids
of its updates."""
from __future__ import annotations

import queue
import threading
import time

import grpc

from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.executor.v1 import executor_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import ExecutorProcess


class Stream:
    """A Session: messages go up through a queue, updates come down in a thread."""

    def __init__(self, executor: ExecutorProcess) -> None:
        self.up: queue.Queue = queue.Queue()
        self.updates: queue.Queue = queue.Queue()
        self.call = pb_grpc.ExecutorStub(executor.channel()).Session(iter(self.up.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self.call:
                for update in response.updates:
                    self.updates.put(update)
        except grpc.RpcError:
            pass

    def submit(self, request_id: str, prompt: list[int], **sampling) -> None:
        self.up.put(pb.SessionRequest(submit=pb.SubmitRequest(
            request_id=request_id, prompt_token_ids=prompt,
            sampling=pb.SamplingParams(**sampling))))

    def cancel(self, request_id: str) -> None:
        self.up.put(pb.SessionRequest(cancel=pb.CancelRequest(request_id=request_id)))

    def until_finished(self, request_id: str, timeout_s: float = 60) -> list:
        updates, deadline = [], time.monotonic() + timeout_s
        while True:
            update = self.updates.get(timeout=max(0.1, deadline - time.monotonic()))
            if update.request_id == request_id:
                updates.append(update)
                if update.finished:
                    return updates

    def until_all_finished(self, request_ids, timeout_s: float = 60) -> dict[str, list]:
        """Every update of each request, until all of them finished (others are dropped)."""
        updates: dict[str, list] = {request_id: [] for request_id in request_ids}
        unfinished, deadline = set(updates), time.monotonic() + timeout_s
        while unfinished:
            update = self.updates.get(timeout=max(0.1, deadline - time.monotonic()))
            if update.request_id in updates:
                updates[update.request_id].append(update)
                if update.finished:
                    unfinished.discard(update.request_id)
        return updates

    def close(self) -> None:
        self.up.put(None)
        self.call.cancel()


def tokens_of(updates: list, index: int = 0) -> list[int]:
    return [t for u in updates for c in u.completions if c.index == index for t in c.token_ids]
