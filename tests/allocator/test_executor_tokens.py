"""Per-executor tokens on the real allocator: an executor acts only on its own pool.

With `--executor-tokens`, executor "a" calls with its own token and may register, renew and step
only pool "a". The same calls for "a" made with "b"'s token, or with the shared token (which
the gateway holds), are PERMISSION_DENIED and change nothing; an executor's token opens no admin
RPC. A real executor process registers and serves with its own token.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from allocator_service.server.executor_tokens import parse_executor_tokens
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import (REPO_ROOT, AllocatorProcess, ExecutorProcess,
                                                   hermetic_env, pagedctl_audit)
from tests.support.allocator_wire import Code, allocate, register, rpc_error, seq_ids
from tests.support.executor_session import Stream, tokens_of
from tests.support.polling import wait_for

pytestmark = pytest.mark.timeout(120)

SHARED = "shared-token-of-the-gateway"
TOKEN_A = "a" * 8 + "-token-of-executor-a"
TOKEN_B = "b" * 8 + "-token-of-executor-b"
TOKENS_FILE = f"# executor id, its token\na {TOKEN_A}\n\nb {TOKEN_B}\n"


@pytest.fixture(scope="module")
def allocator(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "executor-tokens"
    path.write_text(TOKENS_FILE)
    with AllocatorProcess("--auth-token", SHARED, "--executor-tokens", str(path)) as process:
        yield process


def stub(allocator: AllocatorProcess, token: str) -> pb_grpc.AllocatorStub:
    return pb_grpc.AllocatorStub(allocator.channel(token))


def test_an_executor_steps_its_own_pool_and_no_other(allocator):
    a = register(stub(allocator, TOKEN_A), "a")
    a.step(allocate("a-seq", [1, 2, 3, 4, 5]))
    admin = pb_grpc.AllocatorAdminStub(allocator.channel(SHARED))
    before = admin.GetBlockTable(pb.GetBlockTableRequest(executor_id="a", seq_id="a-seq"),
                                 timeout=5)

    as_b = stub(allocator, TOKEN_B)
    step = a.request(99, pb.BlockOp(free=pb.FreeOp(seq_id="a-seq")))
    error = rpc_error(lambda: as_b.Step(step, timeout=5))
    assert error.code() == Code.PERMISSION_DENIED
    assert error.details() == ("executor 'b' may not call Step for executor 'a': each executor "
                               "acts only on its own pool, with its own token")
    heartbeat = pb.HeartbeatRequest(executor_id="a", epoch=a.epoch)
    assert rpc_error(lambda: as_b.Heartbeat(heartbeat, timeout=5)).code() == \
        Code.PERMISSION_DENIED
    # Re-registering would reset "a"'s pool.
    error = rpc_error(lambda: register(as_b, "a"))
    assert error.code() == Code.PERMISSION_DENIED and "RegisterExecutor" in error.details()

    as_gateway = stub(allocator, SHARED)
    error = rpc_error(lambda: as_gateway.Step(step, timeout=5))
    assert error.code() == Code.PERMISSION_DENIED
    assert "needs that executor's own token from --executor-tokens" in error.details()

    after = admin.GetBlockTable(pb.GetBlockTableRequest(executor_id="a", seq_id="a-seq"),
                                timeout=5)
    assert after == before and seq_ids(admin, "a") == ["a-seq"]
    a.step(pb.BlockOp(free=pb.FreeOp(seq_id="a-seq")))   # its own token still works
    assert seq_ids(admin, "a") == []


def test_an_unlisted_executor_cannot_register(allocator):
    error = rpc_error(lambda: register(stub(allocator, TOKEN_A), "c"))
    assert error.code() == Code.PERMISSION_DENIED
    assert error.details().startswith("executor 'a' may not call RegisterExecutor for executor "
                                      "'c'")


@pytest.mark.parametrize("call", ["MatchPrefix", "Audit", "ResetPrefixCache", "StreamEvents"])
def test_an_executor_token_opens_no_other_rpc(allocator, call):
    channel = allocator.channel(TOKEN_A)
    if call == "MatchPrefix":
        invoke = lambda: pb_grpc.AllocatorStub(channel).MatchPrefix(  # noqa: E731
            pb.MatchPrefixRequest(token_ids=[1]), timeout=5)
    else:
        request = getattr(pb, f"{call}Request")()
        method = getattr(pb_grpc.AllocatorAdminStub(channel), call)
        invoke = (lambda: list(method(request, timeout=5))) if call == "StreamEvents" \
            else (lambda: method(request, timeout=5))
    error = rpc_error(invoke)
    assert error.code() == Code.PERMISSION_DENIED
    assert error.details() == (f"the token of executor 'a' may only call RegisterExecutor, "
                               f"Heartbeat and Step for that executor, not {call}; use the "
                               "shared --auth-token")


def test_a_wrong_token_is_still_unauthenticated(allocator):
    error = rpc_error(lambda: register(stub(allocator, "not-a-token-anyone-has"), "a"))
    assert error.code() == Code.UNAUTHENTICATED
    assert "an executor's token from --executor-tokens" in error.details()


def test_a_real_executor_serves_with_its_own_token(allocator, tmp_path):
    with ExecutorProcess("--allocator", allocator.target, "--executor-id", "b",
                         "--allocator-token", TOKEN_B, "--num-blocks", "32",
                         env={"PAGEDSERVE_CACHE_DIR": str(tmp_path)}) as executor:
        stream = Stream(executor)
        try:
            stream.submit("r", list(b"own token"), max_tokens=8, temperature=0,
                          ignore_eos=True)
            updates = stream.until_finished("r")
        finally:
            stream.close()
        assert not updates[-1].error and len(tokens_of(updates)) == 8
        admin = pb_grpc.AllocatorAdminStub(allocator.channel(SHARED))
        listed = admin.ListExecutors(pb.ListExecutorsRequest(), timeout=5).executors
        assert "b" in {executor.executor_id for executor in listed}
        wait_for(lambda: seq_ids(admin, "b") == [])   # freed by the step after the last token
        assert pagedctl_audit(allocator, SHARED).returncode == 0


@pytest.mark.parametrize("text, message", [
    ("a short\n", "shorter than 16 characters"),
    (f"a {TOKEN_A}\na {TOKEN_B}\n", "executor 'a' is listed twice"),
    (f"a {TOKEN_A}\nb {TOKEN_A}\n", "executor 'b' has the same token as 'a'"),
    (f"a {SHARED}\n", "is the shared --auth-token"),
    (f"a {TOKEN_A} extra\n", "expected 'EXECUTOR_ID TOKEN', got 3 fields"),
    ("# nothing\n", "no 'EXECUTOR_ID TOKEN' line"),
])
def test_a_malformed_tokens_file_is_refused_by_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse_executor_tokens(text, "tokens", SHARED)


def test_the_allocator_refuses_to_start_on_a_bad_tokens_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"a {TOKEN_A}\nb {TOKEN_A}\n")
    for args, message in [
        (["--auth-token", SHARED, "--executor-tokens", str(path)],
         f"{path}:2: executor 'b' has the same token as 'a'"),
        (["--executor-tokens", str(path)], "--executor-tokens needs --auth-token too"),
        (["--auth-token", SHARED, "--executor-tokens", str(tmp_path / "missing")],
         "cannot read --executor-tokens"),
    ]:
        done = subprocess.run([sys.executable, "-m", "allocator_service", "--port", "0", *args],
                              cwd=REPO_ROOT, env=hermetic_env(), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0 and message in done.stderr, done.stderr
