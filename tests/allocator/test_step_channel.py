"""The Step channel on the real allocator: Steps as length-prefixed frames on a TCP (or TLS)
connection, answered by the code the Step RPC runs. The same ops answer the same bytes over
either transport; a hello is checked as a Step RPC's token is; a Step's refusal leaves the
connection serving, a refused hello or an unreadable frame closes it; the executor's client
finds a restarted allocator's new port, or uses the RPC where there is no channel.
"""
from __future__ import annotations

import shutil
import socket
from collections.abc import Callable

import pytest

from executor_service.allocator_client import PoolLost, RemoteBlockAllocator
from executor_service.step_channel_client import StepChannelClient
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.server import MAX_MESSAGE_BYTES
from pagedserve.protocol.block_ops import AllocateOp, FreeOp
from pagedserve.protocol.step_frames import LENGTH, StepChannelError, frame, hello_frame
from pagedserve.supervisor.redis_server import REDIS_SERVER, RedisProcess
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.allocator_wire import (TOKEN, Code, Executor, allocate, free, register,
                                          rpc_error, seq_ids)
from tests.support.durability import (MIXED_WORKLOAD, MIXED_WORKLOAD_OUTCOMES, POOLS,
                                      assert_audit_clean, kill_9, outcomes, stubs)
from tests.support.step_channel import RawConnection
from tests.support.tls_certs import make_certificates

pytestmark = pytest.mark.timeout(120)

# gpu-a's part of the durability tests' workload: prefix hits, forks, copy-on-write, lookahead,
# and ops that fail alone (out of blocks, too large, unknown and duplicate sequences).
WORKLOAD = [ops for executor_id, ops in MIXED_WORKLOAD if executor_id == "gpu-a"]
OUTCOMES = [expected for (executor_id, _), expected in zip(MIXED_WORKLOAD,
                                                           MIXED_WORKLOAD_OUTCOMES)
            if executor_id == "gpu-a"]
SHARED = "shared-token-of-the-gateway"
TOKEN_A = "a" * 8 + "-token-of-executor-a"
TOKEN_B = "b" * 8 + "-token-of-executor-b"


def client_of(executor: Executor, token: str = "") -> StepChannelClient:
    return StepChannelClient("127.0.0.1", executor.step_channel_port, executor.executor_id,
                             token)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_channel_answers_a_workload_exactly_as_the_rpc(allocator: AllocatorProcess) -> None:
    stub, admin = stubs(allocator)
    over_rpc = register(stub, "over-rpc", *POOLS["gpu-a"])
    over_channel = register(stub, "over-channel", *POOLS["gpu-a"])
    assert over_channel.step_channel_port not in (0, allocator.port)
    client = client_of(over_channel)

    rpc_answers = [over_rpc.step(*ops) for ops in WORKLOAD]
    channel_answers = [client.step(over_channel.request(next(over_channel.step_ids), *ops), 5)
                       for ops in WORKLOAD]
    assert channel_answers == rpc_answers
    assert outcomes(channel_answers) == OUTCOMES
    client.close()
    assert_audit_clean(admin)


def test_a_retried_step_id_over_the_channel_returns_the_recorded_result(
        stub: pb_grpc.AllocatorStub, admin: pb_grpc.AllocatorAdminStub,
        new_executor: Callable[..., Executor]) -> None:
    executor = new_executor(num_blocks=8, block_size=4)
    client = client_of(executor)
    first_request = executor.request(1, allocate("s", [1, 2, 3, 4, 5]))
    first = client.step(first_request, 5)
    assert (list(first.results), first.num_free_blocks, first.replayed) == (
        [pb.OpResult(block_table=[0, 1])], 6, False)
    assert list(client.step(executor.request(2, free("s")), 5).results) == [pb.OpResult()]

    again = client.step(first_request, 5)
    assert (list(again.results), again.num_free_blocks, again.replayed) == (
        list(first.results), 6, True)
    # The retry may come over the other transport: the step is known by its content.
    assert stub.Step(first_request, timeout=5) == again
    assert seq_ids(admin, executor.executor_id) == []   # "s" stays freed: nothing reapplied
    client.close()


def test_pipelined_steps_are_answered_in_request_order(
        new_executor: Callable[..., Executor]) -> None:
    executor = new_executor(num_blocks=8, block_size=4)
    connection = RawConnection(executor.step_channel_port)
    steps = [executor.request(1, allocate("a", [1, 2, 3, 4, 5])),
             executor.request(2, pb.BlockOp()),   # refused alone: the others go on
             executor.request(2, allocate("b", [6])),
             executor.request(3, free("a"))]
    connection.send(hello_frame(executor.executor_id) + b"".join(
        frame(step.SerializeToString()) for step in steps))   # one write, then read
    assert connection.reply() == b""
    assert list(pb.StepResponse.FromString(connection.reply()).results) == [
        pb.OpResult(block_table=[0, 1])]
    assert connection.refusal().code() == Code.INVALID_ARGUMENT
    assert [list(pb.StepResponse.FromString(connection.reply()).results) for _ in range(2)] == [
        [pb.OpResult(block_table=[2])], [pb.OpResult()]]


def test_a_hello_with_a_wrong_or_missing_token_is_unauthenticated_and_closed(
        start_allocator: Callable[..., AllocatorProcess]) -> None:
    auth_server = start_allocator("--auth-token", TOKEN)
    stub = pb_grpc.AllocatorStub(auth_server.channel(TOKEN))
    executor = register(stub, "hello-auth")
    wrong_rpc = rpc_error(lambda: pb_grpc.AllocatorStub(auth_server.channel("wrong")).Step(
        executor.request(1), timeout=5))
    for token, details in (("wrong", wrong_rpc.details()),
                           ("", "missing 'authorization: Bearer <token>' in the Step channel's "
                                "hello (its auth_token); pass the service's --auth-token "
                                "(PAGEDSERVE_AUTH_TOKEN)")):
        connection = RawConnection(executor.step_channel_port)
        connection.send(frame(pb.StepChannelHello(executor_id="hello-auth",
                                                  auth_token=token).SerializeToString()))
        refusal = connection.refusal()
        assert (refusal.code(), refusal.details()) == (Code.UNAUTHENTICATED, details)
        assert connection.closed_by_allocator()
    assert wrong_rpc.code() == Code.UNAUTHENTICATED

    connection = RawConnection(executor.step_channel_port)
    connection.hello("hello-auth", TOKEN)
    assert list(connection.step(executor.request(1, allocate("s", [1]))).results) == [
        pb.OpResult(block_table=[0])]


def test_with_executor_tokens_a_connection_steps_only_its_own_executor(
        start_allocator: Callable[..., AllocatorProcess], tmp_path) -> None:
    tokens = tmp_path / "executor-tokens"
    tokens.write_text(f"a {TOKEN_A}\nb {TOKEN_B}\n")
    allocator = start_allocator("--auth-token", SHARED, "--executor-tokens", str(tokens))
    a = register(pb_grpc.AllocatorStub(allocator.channel(TOKEN_A)), "a")
    b = register(pb_grpc.AllocatorStub(allocator.channel(TOKEN_B)), "b")
    as_a = pb_grpc.AllocatorStub(allocator.channel(TOKEN_A))

    connection = RawConnection(a.step_channel_port)
    connection.hello("a", TOKEN_A)
    connection.send(frame(b.request(1, allocate("b-seq", [1])).SerializeToString()))
    refusal = connection.refusal()
    assert (refusal.code(), refusal.details()) == (
        Code.PERMISSION_DENIED, "this Step channel connection said hello as executor 'a'; it "
                                "may not carry a Step of executor 'b'")
    # A refused Step leaves the connection serving, like a failed call on a gRPC channel.
    assert list(connection.step(a.request(1, allocate("a-seq", [1]))).results) == [
        pb.OpResult(block_table=[0])]

    # A hello for another executor, or with the shared token, is refused as the RPC is.
    for executor_id, token, rpc in (
            ("b", TOKEN_A, lambda: as_a.Step(b.request(1), timeout=5)),
            ("a", SHARED, lambda: pb_grpc.AllocatorStub(allocator.channel(SHARED)).Step(
                a.request(2), timeout=5))):
        expected = rpc_error(rpc)
        refused = RawConnection(a.step_channel_port)
        refused.send(frame(pb.StepChannelHello(executor_id=executor_id,
                                               auth_token=token).SerializeToString()))
        refusal = refused.refusal()
        assert (refusal.code(), refusal.details()) == (Code.PERMISSION_DENIED,
                                                       expected.details())
        assert expected.code() == Code.PERMISSION_DENIED
        assert refused.closed_by_allocator()
    assert seq_ids(pb_grpc.AllocatorAdminStub(allocator.channel(SHARED)), "b") == []


def test_step_refusals_carry_the_rpc_codes_and_the_connection_serves_on(
        stub: pb_grpc.AllocatorStub, new_executor: Callable[..., Executor]) -> None:
    executor = new_executor()
    connection = RawConnection(executor.step_channel_port)
    connection.hello(executor.executor_id)
    stale = Executor(stub, executor.executor_id, executor.epoch + 1).request(
        1, allocate("s", [1]))
    invalid = executor.request(1, pb.BlockOp())
    # Packed ids as our client sends them, but 3 bytes: the wire reader leaves it to protobuf's
    # path, which refuses it as the RPC does.
    ragged = executor.request(1, pb.BlockOp(append=pb.AppendOp(seq_id="s",
                                                               packed_token_ids=b"\x01\x02\x03")))
    for request, code in ((stale, Code.FAILED_PRECONDITION), (invalid, Code.INVALID_ARGUMENT),
                          (ragged, Code.INVALID_ARGUMENT)):
        connection.send(frame(request.SerializeToString()))
        refusal = connection.refusal()
        expected = rpc_error(lambda: stub.Step(request, timeout=5))
        assert (refusal.code(), refusal.details()) == (code, expected.details())
        assert expected.code() == code

    unknown = RawConnection(executor.step_channel_port)
    unknown.hello("nobody-registered-this")
    ghost = Executor(stub, "nobody-registered-this", 1).request(1, allocate("s", [1]))
    unknown.send(frame(ghost.SerializeToString()))
    refusal = unknown.refusal()
    expected = rpc_error(lambda: stub.Step(ghost, timeout=5))
    assert (refusal.code(), refusal.details()) == (Code.NOT_FOUND, expected.details())

    assert list(connection.step(executor.request(1, allocate("s", [1]))).results) == [
        pb.OpResult(block_table=[0])]


def test_an_unreadable_frame_is_invalid_argument_and_closes_only_its_connection(
        stub: pb_grpc.AllocatorStub, new_executor: Callable[..., Executor]) -> None:
    executor = new_executor()
    bystander = RawConnection(executor.step_channel_port)
    bystander.hello(executor.executor_id)
    too_long = LENGTH.pack(MAX_MESSAGE_BYTES + 1)
    cases = {  # bytes sent after the hello (None: as the hello): what the refusal says
        frame(b"\xff\xff\xff"): "a frame does not parse as a StepRequest",
        too_long: f"a frame of {MAX_MESSAGE_BYTES + 1} bytes is larger than the limit of "
                  f"{MAX_MESSAGE_BYTES} bytes",
    }
    for data, message in cases.items():
        connection = RawConnection(executor.step_channel_port)
        connection.hello(executor.executor_id)
        connection.send(data)
        refusal = connection.refusal()
        assert refusal.code() == Code.INVALID_ARGUMENT
        assert refusal.details().startswith(message), refusal.details()
        assert connection.closed_by_allocator()
    connection = RawConnection(executor.step_channel_port)
    connection.send(frame(b"\xff\xff\xff"))
    refusal = connection.refusal()
    assert (refusal.code(), refusal.details().split(":")[0]) == (
        Code.INVALID_ARGUMENT, "the first frame does not parse as a StepChannelHello")
    assert connection.closed_by_allocator()

    assert bystander.step(executor.request(next(executor.step_ids), allocate("s", [1]))
                          ).results[0].block_table == [0]
    assert executor.step(free("s")).results[0] == pb.OpResult()


def test_step_port_minus_one_serves_no_channel_and_the_client_uses_the_rpc(
        start_allocator: Callable[..., AllocatorProcess]) -> None:
    allocator = start_allocator("--step-port", "-1")
    assert register(pb_grpc.AllocatorStub(allocator.channel()), "probe").step_channel_port == 0
    client = RemoteBlockAllocator(allocator.target, "rpc-only", "127.0.0.1:1")
    client.register(8, 4, "test-model")
    assert client.steps_over == "the Step RPC"
    assert client.submit([AllocateOp("s", (1, 2, 3, 4, 5))]).result().results[0].block_table \
        == [0, 1]
    client.close()
    assert "no Step channel (--step-port -1)" in allocator.stderr_tail()


def test_steps_cross_the_channel_over_tls(tmp_path) -> None:
    certificates = make_certificates(tmp_path / "certs")
    ca = str(certificates.ca)
    with AllocatorProcess("--tls-cert", str(certificates.cert), "--tls-key",
                          str(certificates.key), tls_ca=ca) as allocator:
        client = RemoteBlockAllocator(allocator.target, "over-tls", "127.0.0.1:1", tls_ca=ca)
        client.register(8, 4, "test-model")
        port = register(pb_grpc.AllocatorStub(allocator.channel()), "probe").step_channel_port
        assert client.steps_over == f"the Step channel at 127.0.0.1:{port}"
        assert client.submit([AllocateOp("s", (1, 2, 3, 4, 5))]).result().results[0] \
            .block_table == [0, 1]
        assert "Step channel on 127.0.0.1:" in allocator.stderr_tail()
        assert "(TLS)" in allocator.stderr_tail()

        # A plaintext client, or one that trusts another CA, never gets a Step through.
        stranger = make_certificates(tmp_path / "stranger")
        request = pb.StepRequest(executor_id="over-tls", epoch=1, step_id=2,
                                 ops=[pb.BlockOp(free=pb.FreeOp(seq_id="s"))])
        for tls_ca in ("", str(stranger.ca)):
            outsider = StepChannelClient("127.0.0.1", port, "over-tls", tls_ca=tls_ca)
            with pytest.raises(StepChannelError) as caught:
                outsider.step(request, 5)
            assert caught.value.code() == Code.UNAVAILABLE
        assert client.submit([FreeOp("s")]).result().results[0].block_table == []
        client.close()


@pytest.mark.skipif(shutil.which(REDIS_SERVER) is None, reason="redis-server is not installed")
def test_the_client_finds_a_restarted_durable_allocator_on_its_new_port(
        redis_server: RedisProcess, durable_allocator: Callable[..., AllocatorProcess]) -> None:
    first = durable_allocator(redis_server.url)
    client = RemoteBlockAllocator(first.target, "riding-out", "127.0.0.1:1",
                                  retry_deadline_s=60)
    epoch = client.register(8, 4, "test-model")
    assert client.submit([AllocateOp("a", (1, 2, 3, 4, 5))]).result().results[0] \
        .block_table == [0, 1]

    kill_9(first)
    in_outage = client.submit([AllocateOp("b", (6, 7, 8))])
    new_port = free_port()
    second = durable_allocator(redis_server.url, "--port", str(first.port),
                               "--step-port", str(new_port))
    assert in_outage.result().results[0].block_table == [2]
    assert client.epoch == epoch   # the recovered pool, not a new registration
    assert client.steps_over == f"the Step channel at 127.0.0.1:{new_port}"
    stub, admin = stubs(second)
    assert seq_ids(admin, "riding-out") == ["a", "b"]
    assert_audit_clean(admin)
    client.close()


def test_re_registering_with_a_restarted_allocator_steps_over_its_new_port(
        start_allocator: Callable[..., AllocatorProcess]) -> None:
    first = start_allocator()
    client = RemoteBlockAllocator(first.target, "starting-over", "127.0.0.1:1",
                                  retry_deadline_s=60)
    client.register(8, 4, "test-model")
    client.submit([AllocateOp("a", (1, 2, 3, 4, 5))]).result()

    kill_9(first)
    new_port = free_port()
    start_allocator("--port", str(first.port), "--step-port", str(new_port))
    with pytest.raises(PoolLost):   # an allocator in memory forgot the pool
        client.submit([AllocateOp("b", (6, 7, 8))]).result()
    assert client.register(8, 4, "test-model") == 1
    assert client.steps_over == f"the Step channel at 127.0.0.1:{new_port}"
    assert client.submit([AllocateOp("b", (6, 7, 8))]).result().results[0].block_table == [0]
    client.close()


def test_a_stopping_allocator_closes_the_channel_with_its_grpc_port(
        start_allocator: Callable[..., AllocatorProcess]) -> None:
    allocator = start_allocator()
    executor = register(pb_grpc.AllocatorStub(allocator.channel()), "until-sigterm")
    connection = RawConnection(executor.step_channel_port)
    connection.hello("until-sigterm")
    assert connection.step(executor.request(1, allocate("s", [1]))).results[0].block_table == [0]

    assert allocator.stop() == 0   # SIGTERM: a graceful stop
    assert connection.closed_by_allocator()
    with pytest.raises(ConnectionRefusedError):
        RawConnection(executor.step_channel_port)
