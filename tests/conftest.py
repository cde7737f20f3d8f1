"""Fixtures every test folder shares (a root conftest is inherited by tests/<area>/), and the
skipping of `gpu` tests without CUDA. The helper modules the tests import are in tests/support/;
tests/README.md says which folder holds what.

The fixtures start the real allocator as a subprocess (pagedserve/supervisor/service_process.py),
alone, with extra flags, or journalling to a redis-server of its own. `server` (with its `stub`
and `admin`) and `auth_server` are shared by the whole session: tests on them register executors
of their own, named after the test (`new_executor`), so they never collide.
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's CPU interpreter, which is chosen when a kernel
# is defined: so before any test module imports kernels/.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Before anything imports the helper modules, so their asserts report like test asserts.
pytest.register_assert_rewrite("tests.support")

from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc  # noqa: E402

# The process supervisors and the wire helpers bring grpc_health, grpc_reflection and redis,
# which the lent GPU machines lack; every test module imports this file, the gpu tests too
# (scripts/device_check.sh), so the fixtures import them when they run instead.
if TYPE_CHECKING:
    from pagedserve.supervisor.redis_server import RedisProcess
    from pagedserve.supervisor.service_process import AllocatorProcess
    from tests.support.allocator_wire import Executor


@pytest.fixture
def allocator() -> Iterator[AllocatorProcess]:
    """A plain allocator of its own for one test."""
    from pagedserve.supervisor.service_process import AllocatorProcess

    with AllocatorProcess() as process:
        yield process


@pytest.fixture
def start_allocator() -> Iterator[Callable[..., AllocatorProcess]]:
    """Starts allocators with extra flags, e.g. start_allocator("--auth-token", "t",
    "--lease-ttl", "0.5"); every one started is stopped when the test ends."""
    from pagedserve.supervisor.service_process import AllocatorProcess

    started: list[AllocatorProcess] = []

    def start(*extra_args: str) -> AllocatorProcess:
        started.append(AllocatorProcess(*extra_args))
        return started[-1]

    yield start
    for process in started:
        process.stop()


# -- durable allocators and their Redis ----------------------------------------------------------

@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of its own for one test: append-only file with an fsync per write, so
    what it acknowledged survives its kill()."""
    from pagedserve.supervisor.redis_server import RedisProcess

    with RedisProcess(tmp_path / "redis") as process:
        yield process


@pytest.fixture
def durable_allocator() -> Iterator[Callable[..., AllocatorProcess]]:
    """Starts allocators that journal to a Redis, e.g. durable_allocator(redis_server.url,
    "--snapshot-every", "5"); each waits for SERVING (its state loaded), and every one started
    is stopped when the test ends (stop() also reaps one the test killed with SIGKILL)."""
    from pagedserve.supervisor.service_process import AllocatorProcess

    started: list[AllocatorProcess] = []

    def start(state_url: str, *extra_args: str) -> AllocatorProcess:
        # The test Redis fsyncs every write: on a disk shared with the other test worker an
        # fsync has taken over the default 2 s, refusing a commit no test meant to refuse.
        started.append(AllocatorProcess("--state-url", state_url, "--state-timeout", "10",
                                        *extra_args))
        return started[-1]

    yield start
    for process in started:
        process.stop()


# -- the shared servers of the wire tests ---------------------------------------------------------

@pytest.fixture(scope="session")
def server() -> Iterator[AllocatorProcess]:
    """Shared by every test that registers executors of its own; leases outlast the session."""
    from pagedserve.supervisor.service_process import AllocatorProcess

    with AllocatorProcess("--lease-ttl", "600") as process:
        yield process


@pytest.fixture(scope="session")
def stub(server: AllocatorProcess) -> pb_grpc.AllocatorStub:
    return pb_grpc.AllocatorStub(server.channel())


@pytest.fixture(scope="session")
def admin(server: AllocatorProcess) -> pb_grpc.AllocatorAdminStub:
    return pb_grpc.AllocatorAdminStub(server.channel())


@pytest.fixture(scope="session")
def auth_server() -> Iterator[AllocatorProcess]:
    from pagedserve.supervisor.service_process import AllocatorProcess
    from tests.support.allocator_wire import TOKEN

    with AllocatorProcess("--auth-token", TOKEN) as process:
        yield process


@pytest.fixture
def new_executor(stub: pb_grpc.AllocatorStub,
                 request: pytest.FixtureRequest) -> Callable[..., Executor]:
    """Registers executors named after the test, so tests sharing a server never collide."""
    from tests.support.allocator_wire import register

    names = (f"{request.node.name}-{n}" for n in itertools.count())

    def make(num_blocks: int = 8, block_size: int = 4) -> Executor:
        return register(stub, next(names), num_blocks, block_size)

    return make


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `gpu` run the compiled kernels; without CUDA they are skipped, not failed."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
