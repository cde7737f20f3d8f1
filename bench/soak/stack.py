"""The soak's stack: a redis-server, an allocator journaling to it (`--state-url`), one executor
on the embedded default model and a gateway, each a subprocess on a free loopback port, started
with the process supervisors of pagedserve/supervisor/.

`restart_allocator()` is the fault the soak injects: SIGKILL, no goodbye, then the allocator
starts again on the same port and the same Redis, so the executor's retried Steps and the
gateway's next lookups reach it where they left it.
"""
from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from pathlib import Path

from pagedserve.supervisor.redis_server import RedisProcess
from pagedserve.supervisor.service_process import AllocatorProcess, ExecutorProcess, GatewayProcess

# Every cache in the stack is bounded, but at their default sizes the soak's traffic takes
# longer than the run to fill some of them, and a cache still filling looks like a leak to
# the memory check. So they are sized to fill within the first minute or so (the warm-up the
# check skips), which also makes the run evict and trim many times over:
# - the executor's pool, 1,024 blocks (the embedded default is 8,192): the allocator keeps a
#   hashed block in its prefix index until the block is reused, and with 8,192 blocks its
#   object count was still rising when a 10-minute soak ended.
# - the allocator's KV event stream in Redis, --events-max 500 (default 100,000): the soak
#   writes about 13 events a second, so the default cap is two hours of it.
NUM_BLOCKS = 1024
EVENTS_MAX = 500


class SoakStack:
    """`with SoakStack(data_dir, cache_root) as stack:` serves at `stack.gateway.target` and
    `stack.gateway.http_url`; everything started is stopped on exit, the gateway first."""

    def __init__(self, data_dir: Path, cache_root: Path) -> None:
        self._data_dir = data_dir
        self._env = {"PAGEDSERVE_CACHE_DIR": str(cache_root)}
        self._exits = ExitStack()
        self._lock = threading.Lock()   # the allocator is swapped by another thread
        self.redis: RedisProcess | None = None
        self.allocator: AllocatorProcess | None = None
        self.executor: ExecutorProcess | None = None
        self.gateway: GatewayProcess | None = None

    def __enter__(self) -> SoakStack:
        try:
            # everysec: the soak kills the allocator, never Redis, so what an fsync per write
            # would add is disk traffic, not a guarantee this run could observe.
            self.redis = self._exits.enter_context(
                RedisProcess(self._data_dir / "redis", appendfsync="everysec"))
            self.allocator = AllocatorProcess(*self._allocator_args())
            self._exits.callback(lambda: self.allocator.stop())
            self.executor = self._exits.enter_context(ExecutorProcess(
                "--allocator", self.allocator.target, "--num-blocks", str(NUM_BLOCKS),
                env=self._env))
            self.gateway = self._exits.enter_context(GatewayProcess(
                "--allocator", self.allocator.target))
        except BaseException:
            self._exits.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._exits.close()

    def restart_allocator(self) -> float:
        """kill -9, then start again on the same port and Redis; the seconds it was away."""
        assert self.allocator is not None and self.redis is not None
        killed = time.monotonic()
        with self._lock:
            port = self.allocator.port
            self.allocator.process.kill()
            self.allocator.stop()          # reaps it
            self.allocator = AllocatorProcess(*self._allocator_args(), "--port", str(port))
        return time.monotonic() - killed

    def _allocator_args(self) -> tuple[str, ...]:
        assert self.redis is not None
        return "--state-url", self.redis.url, "--events-max", str(EVENTS_MAX)

    @property
    def allocator_target(self) -> str:
        assert self.allocator is not None
        return self.allocator.target

    def pids(self) -> dict[str, int]:
        """Each service's process id now (the allocator's changes when it restarts)."""
        with self._lock:
            services = {"allocator": self.allocator, "executor": self.executor,
                        "gateway": self.gateway}
            pids = {name: service.pid for name, service in services.items() if service}
        if self.redis is not None and self.redis.pid is not None:
            pids["redis"] = self.redis.pid
        return pids
