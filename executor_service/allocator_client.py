"""The executor's client of the allocator service: the engine's BlockAllocator over gRPC.

A Step is sent from the client's one call thread, so the engine computes while it is in flight
(grpc's own `future()` would start a thread per call to drive it: one per engine iteration).
An allocator that does not answer (restarting, or its Redis down) is retried with the SAME step
id and backoff: the allocator is idempotent per step id, so a reply lost with a crash is
recovered without applying anything twice, and a durable allocator that comes back continues
where it was.
An allocator that no longer knows this executor, or knows it under a newer epoch, lost (or
handed on) our pool: `PoolLost` tells the engine to re-register and recompute what it ran.

Steps go over the allocator's Step channel when its registration names one (a cheaper
transport, executor_service/step_channel_client.py), else over the Step RPC; both fail with
grpc.RpcError codes, so the retries above are the same. After a lost connection the next Step
first asks for the channel's port again (a Heartbeat): a restarted allocator may listen on
another one, or have none.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import grpc

from executor_service.lease_keeper import LeaseKeeper
from executor_service.step_channel_client import StepChannelClient, target_host
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.client import open_channel
from pagedserve.protocol.block_codec import op_to_proto, step_result_from_proto
from pagedserve.protocol.block_ops import BlockOp, StepResult

log = logging.getLogger(__name__)
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
LOST = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


class PoolLost(Exception):
    """The allocator no longer holds this executor's pool at our epoch."""


class AllocatorGone(Exception):
    """The allocator did not answer within the retry deadline."""



class RemoteStep:
    """A Step in flight; `result()` waits for it, resending it while the allocator is away."""

    def __init__(self, client: RemoteBlockAllocator, request: pb.StepRequest) -> None:
        self.client, self.request = client, request
        self.future = client.send_step(request)

    def result(self) -> StepResult:
        deadline = time.monotonic() + self.client.retry_deadline_s
        backoff = 0.05
        while True:
            try:
                return step_result_from_proto(self.future.result())
            except grpc.RpcError as error:
                code = error.code()
                if code in LOST:
                    raise PoolLost(error.details()) from None
                if code not in RETRIED or time.monotonic() > deadline:
                    raise AllocatorGone(f"Step {self.request.step_id}: {code.name}: "
                                        f"{error.details()}") from None
                log.warning("allocator unavailable (%s); retrying step %d in %.2fs", code.name,
                            self.request.step_id, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                self.future = self.client.send_step(self.request)


class RemoteBlockAllocator:
    def __init__(self, target: str, executor_id: str, address: str, *, token: str = "",
                 tls_ca: str = "", call_timeout_s: float = 10.0,
                 retry_deadline_s: float = 120.0, executor_index: int | None = None) -> None:
        self.channel = open_channel(target, token, tls_ca)
        self.stub = pb_grpc.AllocatorStub(self.channel)
        self._host, self._token, self._tls_ca = target_host(target), token, tls_ca
        # The Step channel's port: 0 none (the Step RPC), None unknown since a connection broke.
        self._channel_port: int | None = 0
        self._registrations = 0
        # Used from the call thread only, with the registration it was made under.
        self._step_client: StepChannelClient | None = None
        self._step_client_registration = 0
        self.executor_id, self.address = executor_id, address
        # Its number in the fleet (--executor-index), registered so the allocator can refuse a
        # second executor with the same one.
        self.executor_index = executor_index
        self.call_timeout_s, self.retry_deadline_s = call_timeout_s, retry_deadline_s
        self.epoch = 0
        self.lease_ttl_s = 10.0
        self.last_step_id = 0
        self._lock = threading.Lock()
        # One thread: Steps reach the allocator in step-id order.
        self._calls = ThreadPoolExecutor(1, thread_name_prefix="allocator-step")
        self._load = (0, 0)   # (waiting, running) as the engine last reported them
        self._keeper = LeaseKeeper(self._keep_lease, lambda: self.lease_ttl_s)

    def register(self, num_blocks: int, block_size: int, model_fingerprint: str) -> int:
        """Registers (or re-registers: the pool starts empty), waiting for the allocator."""
        request = pb.RegisterExecutorRequest(
            executor_id=self.executor_id, address=self.address, num_blocks=num_blocks,
            block_size=block_size, model_fingerprint=model_fingerprint,
            executor_index=self.executor_index)
        deadline = time.monotonic() + self.retry_deadline_s
        while True:
            try:
                reply = self.stub.RegisterExecutor(request, timeout=self.call_timeout_s)
                break
            except grpc.RpcError as error:
                if error.code() not in RETRIED or time.monotonic() > deadline:
                    raise
                log.info("waiting for the allocator (%s)", error.code().name)
                time.sleep(0.2)
        with self._lock:
            self.epoch, self.last_step_id = reply.epoch, 0
            self.lease_ttl_s = reply.lease_ttl_s or self.lease_ttl_s
            # A new registration may be with a restarted allocator: connect afresh.
            self._channel_port = reply.step_channel_port
            self._registrations += 1
        self._keeper.called()
        self._keeper.start()
        log.info("registered %r at epoch %d; Steps go over %s", self.executor_id, reply.epoch,
                 self.steps_over)
        return reply.epoch

    @property
    def steps_over(self) -> str:
        """Where Steps go now (for logs and tests)."""
        port = self._channel_port
        if port == 0:
            return "the Step RPC"
        if port is None:
            return "the Step channel, its port to be asked again"
        return f"the Step channel at {self._host}:{port}"

    def submit(self, ops: Sequence[BlockOp]) -> RemoteStep:
        with self._lock:
            self.last_step_id += 1
            request = pb.StepRequest(executor_id=self.executor_id, epoch=self.epoch,
                                     step_id=self.last_step_id,
                                     ops=[op_to_proto(op) for op in ops])
        return RemoteStep(self, request)

    def send_step(self, request: pb.StepRequest) -> Future:
        """The Step call, in flight; its result() is the reply or raises the grpc.RpcError."""
        self._keeper.called()
        return self._calls.submit(self._step, request)

    def _step(self, request: pb.StepRequest) -> pb.StepResponse:
        """One Step, on the call thread: over the Step channel when the allocator has one."""
        port = self._channel_port
        if port is None:
            port = self._channel_port = self._send_heartbeat().step_channel_port
        if port == 0:
            return self.stub.Step(request, timeout=self.call_timeout_s)
        client = self._step_client
        if (client is None or client.port != port
                or self._step_client_registration != self._registrations):
            if client is not None:
                client.close()
            client = self._step_client = StepChannelClient(
                self._host, port, self.executor_id, self._token, self._tls_ca)
            self._step_client_registration = self._registrations
        try:
            return client.step(request, self.call_timeout_s)
        except grpc.RpcError as error:
            if error.code() in RETRIED:
                self._channel_port = None
            raise

    def heartbeat(self, num_waiting: int, num_running: int) -> None:
        """Renews the lease; raises PoolLost when the allocator dropped our pool."""
        self._load = (num_waiting, num_running)
        self._keeper.called()
        try:
            self._send_heartbeat()
        except grpc.RpcError as error:
            if error.code() in LOST:
                raise PoolLost(error.details()) from None
            log.warning("heartbeat failed: %s", error.code().name)

    def _send_heartbeat(self) -> pb.HeartbeatResponse:
        num_waiting, num_running = self._load
        return self.stub.Heartbeat(pb.HeartbeatRequest(
            executor_id=self.executor_id, epoch=self.epoch, num_waiting=num_waiting,
            num_running=num_running), timeout=self.call_timeout_s)

    def _keep_lease(self) -> None:
        """The lease keeper's renewal, from its own thread. A lost pool is left for the engine
        to find at its next call, which re-registers from the engine's thread."""
        try:
            self._send_heartbeat()
        except grpc.RpcError as error:
            log.debug("lease renewal failed: %s", error.code().name)

    def close(self) -> None:
        self._keeper.close()
        self._calls.shutdown(wait=False, cancel_futures=True)
        if self._step_client is not None:
            self._step_client.close()
        self.channel.close()
