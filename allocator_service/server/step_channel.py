"""The Step channel: executors' Steps over length-prefixed frames on a plain TCP (or TLS)
connection, for a fraction of what the Step RPC costs the allocator's CPU
(docs/allocator.md#the-step-channel; the frames are pagedserve/protocol/step_frames.py).

One thread runs an asyncio event loop with one `asyncio.Protocol` per connection: no thread per
connection or per call. The Steps that arrive in one turn of the loop, from every connection,
are applied at the start of the next turn, in arrival order, by `handle_steps`, the code the
Step RPC runs too, so both transports apply, journal and refuse alike. With Redis they are
journaled in one commit and answered together; in memory, each is answered as soon as it
applied (step_handler.py). A connection starts with a hello that names its
executor and carries the token; the allocator's auth checks it as it checks a Step RPC's
metadata, and every Step on the connection must be that executor's.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import threading

import grpc

from allocator_service.core.step_wire import DecodedStep, decode_step_request, encode_step_response
from allocator_service.durability.state import AllocatorState
from allocator_service.server.step_handler import Outcome, decoded, handle_steps
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.common.auth import BearerTokenInterceptor
from pagedserve.common.error_interceptor import status_of
from pagedserve.common.errors import InvalidArgument, PagedServeError, PermissionDenied
from pagedserve.common.server import ServerOptions, tls_context
from pagedserve.protocol.block_ops import StepResult
from pagedserve.protocol.step_frames import FrameReader, FrameTooLarge, error_frame, reply_frame

log = logging.getLogger(__name__)

STEP_METHOD = "/pagedserve.allocator.v1.Allocator/Step"
HELLO_CARRIER = "in the Step channel's hello (its auth_token)"
# Seconds a stopping channel waits for its connections to flush their last replies.
CLOSE_GRACE_S = 2.0


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on the gRPC server's interface; `port` 0 lets the OS choose."""
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    dualstack = family == socket.AF_INET6 and host == "::" and socket.has_dualstack_ipv6()
    try:
        return socket.create_server((host, port), family=family, backlog=1024,
                                    dualstack_ipv6=dualstack)
    except OSError as error:
        raise SystemExit(f"cannot listen on {host}:{port} for the Step channel "
                         f"(--step-port): {error.strerror}") from None


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # faster where the image has it; never a dependency of ours
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class StepChannel:
    def __init__(self, state: AllocatorState, options: ServerOptions, port: int,
                 auth: BearerTokenInterceptor | None) -> None:
        """Binds now (so RegisterExecutor can name the port before anyone calls); serves
        from start() to stop(). TLS when `options` carry a certificate, as the gRPC port."""
        self.state, self.auth = state, auth
        self._socket = listen(options.host, port)
        self.port: int = self._socket.getsockname()[1]
        self._tls = tls_context(options) if options.tls_cert or options.tls_key else None
        self._loop = new_event_loop()
        self._connections: set[Connection] = set()
        # Steps read in this turn of the loop, answered together in the next (see _answer_all).
        self._arrived: list[tuple[Connection, DecodedStep | pb.StepRequest]] = []
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None

    @property
    def tls(self) -> bool:
        return self._tls is not None

    def start(self) -> None:
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name="step-channel",
                                        daemon=True)
        self._thread.start()
        started.wait()
        if self._stopping is None:
            raise SystemExit("the Step channel could not start; see the log above")

    def stop(self) -> None:
        """Closes the listener and every connection once their replies are written. A batch
        of Steps is applied in one callback of the loop, so none is half-applied when the loop
        gets here; Steps read but not yet applied are never answered (their executors retry)."""
        if self._thread is None or self._stopping is None:
            return
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(CLOSE_GRACE_S + 5.0)
        self._thread = None

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve(started))
        except Exception:  # noqa: BLE001 - said in the log; start() stops the service
            log.exception("the Step channel failed")
        finally:
            self._loop.close()
            started.set()

    async def _serve(self, started: threading.Event) -> None:
        server = await self._loop.create_server(lambda: Connection(self), sock=self._socket,
                                                ssl=self._tls)
        self._stopping = asyncio.Event()   # serving from here on
        started.set()
        await self._stopping.wait()
        server.close()
        closed = [connection.closed for connection in self._connections]
        for connection in list(self._connections):
            connection.transport.close()
        if closed:
            await asyncio.wait(closed, timeout=CLOSE_GRACE_S)

    def check_hello(self, hello: pb.StepChannelHello) -> None:
        """The auth a Step RPC for the hello's executor would get; raises its refusal."""
        if not hello.executor_id:
            raise InvalidArgument("the Step channel's hello names no executor_id")
        if self.auth is not None:
            sent = f"Bearer {hello.auth_token}" if hello.auth_token else None
            self.auth.check(sent, STEP_METHOD, hello, HELLO_CARRIER)

    def submit(self, connection: Connection, step: DecodedStep | pb.StepRequest) -> None:
        """Takes a Step read from `connection` (by the wire reader, or by protobuf where the
        reader left it); its answer is written in the next turn."""
        if not self._arrived:
            # After the callbacks of this turn: every connection read now joins the batch.
            self._loop.call_soon(self._answer_all)
        self._arrived.append((connection, step))

    def _answer_all(self) -> None:
        arrived, self._arrived = self._arrived, []
        steps = [self._admit(connection, step) for connection, step in arrived]
        answered = 0

        def answer(index: int, outcome: Outcome) -> None:
            nonlocal answered
            connection, step = arrived[index]
            if not connection.transport.is_closing():
                connection.transport.write(self._frame(outcome, step.step_id, connection))
            answered = index + 1

        try:
            handle_steps(self.state, steps, answer)
        except Exception as error:  # noqa: BLE001 - a bug in the commit: every Step left says so
            log.exception("a commit of %d Steps on the Step channel failed",
                          len(arrived) - answered)
            for index in range(answered, len(arrived)):
                answer(index, error)

    @staticmethod
    def _admit(connection: Connection, step: DecodedStep | pb.StepRequest
               ) -> DecodedStep | Exception:
        """The Step to apply, or why it is refused before it applies: a Step of another
        executor than the connection's hello, or a malformed op."""
        if step.executor_id != connection.executor_id:
            return PermissionDenied(
                f"this Step channel connection said hello as executor "
                f"{connection.executor_id!r}; it may not carry a Step of executor "
                f"{step.executor_id!r}")
        if isinstance(step, DecodedStep):
            return step
        try:
            return decoded(step)
        except Exception as error:  # noqa: BLE001 - answered to its own Step alone
            return error

    @staticmethod
    def _frame(outcome: Outcome, step_id: int, connection: Connection) -> bytes:
        """The reply frame of one Step."""
        if isinstance(outcome, StepResult):
            # The bytes the core kept for retries, when it kept them (not for a retry's answer).
            return reply_frame(outcome.encoded or encode_step_response(outcome))
        if isinstance(outcome, PagedServeError):
            return error_frame(status_of(outcome), str(outcome))
        # A bug answers INTERNAL; the loop serves on.
        log.error("Step %d of executor %r on the Step channel failed", step_id,
                  connection.executor_id, exc_info=outcome)
        return error_frame(grpc.StatusCode.INTERNAL,
                           f"internal error in Step {step_id} of executor "
                           f"{connection.executor_id!r} (Step channel); see the allocator's log")


class Connection(asyncio.Protocol):
    """One executor's connection: a hello, then Steps answered in order."""

    def __init__(self, channel: StepChannel) -> None:
        self.channel = channel
        self.frames = FrameReader()
        self.executor_id: str | None = None   # set by an accepted hello
        self.transport: asyncio.Transport
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.channel._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel._connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)

    # A client that sends faster than it reads stops being read until its replies drain.
    def pause_writing(self) -> None:
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        try:
            payloads = self.frames.feed(data)
        except FrameTooLarge as error:
            payloads = []
            self._end(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        for payload in payloads:
            if self.transport.is_closing():
                return
            if self.executor_id is None:
                self._hello(payload)
            else:
                self._step(payload)

    def _hello(self, payload: bytes) -> None:
        try:
            hello = pb.StepChannelHello.FromString(payload)
        except Exception as error:  # noqa: BLE001 - protobuf raises DecodeError and others
            self._end(grpc.StatusCode.INVALID_ARGUMENT,
                      f"the first frame does not parse as a StepChannelHello: {error}")
            return
        try:
            self.channel.check_hello(hello)
        except PagedServeError as error:
            self._end(status_of(error), str(error))
            return
        self.executor_id = hello.executor_id
        self.transport.write(reply_frame(b""))

    def _step(self, payload: bytes) -> None:
        assert self.executor_id is not None
        step: DecodedStep | pb.StepRequest | None = decode_step_request(payload)
        if step is None:   # not our client's form: protobuf reads it, or refuses it
            try:
                step = pb.StepRequest.FromString(payload)
            except Exception as error:  # noqa: BLE001
                self._end(grpc.StatusCode.INVALID_ARGUMENT,
                          f"a frame does not parse as a StepRequest: {error}")
                return
        self.channel.submit(self, step)

    def _end(self, code: grpc.StatusCode, message: str) -> None:
        """Answers the error, then closes: the connection cannot go on (no accepted hello,
        or a stream that is no longer cut into frames)."""
        self.transport.write(error_frame(code, message))
        self.transport.close()

