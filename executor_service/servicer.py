"""The thin gRPC layer of the executor: Session streams, GetInfo and GetTokenizer, over the
serving loop."""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc

from executor_service.convert import MAX_SEQ_ID, check_request_id, refusal_to_proto, update_to_proto
from executor_service.engine.engine import Engine
from executor_service.model.tokenizer_files import TokenizerFiles
from executor_service.serving_loop import Refusal, ServingLoop, Session
from pagedserve.common.error_interceptor import Undecodable
from pagedserve.common.errors import InvalidArgument, PagedServeError, Unavailable
from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.executor.v1 import executor_pb2_grpc as pb_grpc
from pagedserve.protocol.sampling_codec import sampling_from_proto

# How often a session's sender looks whether its call has ended while no update comes.
POLL_S = 0.2
# GetTokenizer's chunks: well under gRPC's default 4 MiB message limit (Qwen's tokenizer.json
# alone is about 7 MB).
TOKENIZER_CHUNK_BYTES = 1 << 20


class ExecutorServicer(pb_grpc.ExecutorServicer):
    """Serves once `ready()` hands it the loop; until then (model loading, pool registering)
    every call is UNAVAILABLE, as health says NOT_SERVING."""

    def __init__(self) -> None:
        self.loop: ServingLoop | None = None
        self.static_info = pb.ExecutorInfo()
        self.tokenizer: TokenizerFiles | None = None

    def ready(self, loop: ServingLoop, info: pb.ExecutorInfo,
              tokenizer: TokenizerFiles) -> None:
        self.static_info, self.tokenizer, self.loop = info, tokenizer, loop

    def _loop(self) -> ServingLoop:
        if self.loop is None:
            raise Unavailable("the executor is still loading its model; retry shortly")
        return self.loop

    def Session(self, request_iterator: Iterator[pb.SessionRequest],
                context: grpc.ServicerContext) -> Iterator[pb.SessionResponse]:
        loop = self._loop()
        session = Session()
        context.add_callback(lambda: loop.close(session))
        reader = threading.Thread(target=self._read, args=(request_iterator, session),
                                  name="session-reader", daemon=True)
        reader.start()
        while context.is_active():
            try:
                updates = session.updates.get(timeout=POLL_S)
            except queue.Empty:
                continue
            while True:  # batches that queued up meanwhile go down in the same message
                try:
                    updates = updates + session.updates.get_nowait()
                except queue.Empty:
                    break
            yield pb.SessionResponse(updates=[
                refusal_to_proto(u) if isinstance(u, Refusal) else update_to_proto(u)
                for u in updates])

    def _read(self, request_iterator: Iterator[pb.SessionRequest], session: Session) -> None:
        """Turns the client's messages into loop commands; a malformed one is refused on the
        stream for its request id, the stream itself goes on."""
        try:
            for message in request_iterator:
                if isinstance(message, Undecodable):
                    session.updates.put([Refusal("", InvalidArgument(
                        f"a SessionRequest does not parse: {message.error}"))])
                    continue
                kind = message.WhichOneof("kind")
                if kind == "submit":
                    self._submit(session, message.submit)
                elif kind == "cancel":
                    self.loop.cancel(session, message.cancel.request_id)
                else:
                    session.updates.put([Refusal("", InvalidArgument(
                        "a SessionRequest must set submit or cancel"))])
        except grpc.RpcError:
            pass  # the client went away: the call's callback closes the session

    def _submit(self, session: Session, submit: pb.SubmitRequest) -> None:
        try:
            check_request_id(submit.request_id)
            self._check_fits_allocator(submit)
            params = sampling_from_proto(submit.sampling)
        except PagedServeError as error:
            session.updates.put([Refusal(submit.request_id, error)])
            return
        self.loop.submit(session, submit.request_id, list(submit.prompt_token_ids), params,
                         submit.cache_salt)

    def _check_fits_allocator(self, submit: pb.SubmitRequest) -> None:
        # What the allocator refuses, it refuses for a whole Step, failing every request in
        # it: a submission it would refuse is refused here, alone. (A prompt the whole KV
        # cache cannot hold cannot reach it: the served window fits the cache, and the engine
        # refuses a prompt over the window.)
        if len(submit.cache_salt) > MAX_SEQ_ID:
            raise InvalidArgument(f"cache_salt must be at most {MAX_SEQ_ID} characters, "
                                  f"got {len(submit.cache_salt)}")

    def GetInfo(self, request: pb.GetInfoRequest,
                context: grpc.ServicerContext) -> pb.ExecutorInfo:
        info = pb.ExecutorInfo()
        info.CopyFrom(self.static_info)
        engine: Engine = self._loop().engine
        scheduler = engine.scheduler
        info.num_waiting, info.num_running = len(scheduler.waiting), len(scheduler.running)
        info.num_preemptions, info.num_stalls = scheduler.num_preemptions, scheduler.num_stalls
        info.num_steps = engine.num_steps
        info.epoch = getattr(engine.allocator, "epoch", 0)
        return info

    def GetTokenizer(self, request: pb.GetTokenizerRequest,
                     context: grpc.ServicerContext) -> Iterator[pb.TokenizerChunk]:
        self._loop()
        for name, data in self.tokenizer.files.items():
            for start in range(0, max(len(data), 1), TOKENIZER_CHUNK_BYTES):
                yield pb.TokenizerChunk(file_name=name,
                                        data=data[start:start + TOKENIZER_CHUNK_BYTES])

