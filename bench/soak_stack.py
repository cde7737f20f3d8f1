"""The soak's stack: a redis-server, an allocator journaling to it (`--state-url`), one executor
on the embedded default model and a gateway, each a subprocess on a free loopback port, started
with the test harnesses (tests/redis_process.py, tests/allocator_process.py; bench/soak.py
puts tests/ on sys.path).

`restart_allocator()` is the fault the soak injects: SIGKILL, no goodbye, then the allocator
starts again on the same port and the same Redis, so the executor's retried Steps and the
gateway's next lookups reach it where they left it.
"""
from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from pathlib import Path

from allocator_process import AllocatorProcess, ExecutorProcess, GatewayProcess
from redis_process import RedisProcess


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
            self.allocator = AllocatorProcess("--state-url", self.redis.url)
            self._exits.callback(lambda: self.allocator.stop())
            self.executor = self._exits.enter_context(ExecutorProcess(
                "--allocator", self.allocator.target, env=self._env))
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
            self.allocator = AllocatorProcess("--state-url", self.redis.url,
                                              "--port", str(port))
        return time.monotonic() - killed

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
