"""The whole stack as the serving benchmark runs it: the allocator, one executor and the gateway
as child processes on free loopback ports, started in dependency order, each waited for until
its gRPC health says SERVING, and stopped in reverse order (the gateway drains first, the
allocator goes last) however the benchmark ends.

The command lines and the supervision are `pagedserve up`'s (pagedserve/cli/up.py and the
supervisor's SupervisedProcess), with one difference: a child's output is not echoed (its tail is still shown if
it fails), because the benchmark's stdout is its tables.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from bench.serve.workload import ServeSettings
from pagedserve.cli import up
from pagedserve.supervisor.service_process import hermetic_env as supervisor_env
from pagedserve.supervisor.supervised import SupervisedProcess

# Kept from the caller's environment: where the embedded model is cached. Any other
# PAGEDSERVE_* variable (a port, an API key, a token) would change what is measured.
KEPT_VARIABLES = ("PAGEDSERVE_CACHE_DIR",)


def executor_flags(settings: ServeSettings, model_dir: Path | None) -> list[str]:
    """The in-process engine's settings (engine_load.py builds it from the same)."""
    return ["--device", settings.device, "--dtype", settings.dtype, "--block-size", "16",
            "--kv-cache-memory", str(settings.kv_cache_bytes),
            "--max-num-batched-tokens", str(settings.max_batched_tokens),
            "--max-num-seqs", str(settings.max_num_seqs),
            *(["--model", str(model_dir)] if model_dir is not None else [])]


class Stack:
    """`with Stack(executor_flags(settings, model_dir)) as stack:` the stack serves at
    `stack.grpc_target` and `stack.http_url`; `stack.pids` names each service's process.
    `executor_startup_timeout_s`, when given, replaces up's for the executor (a large model
    loads for longer)."""

    def __init__(self, executor_args: list[str],
                 executor_startup_timeout_s: float | None = None) -> None:
        args = up.build_parser().parse_args([
            "--allocator-port", "0", "--executor-port", "0", "--port", "0", "--http-port", "0",
            "--executor-args", shlex.join(executor_args)])
        self._executor_startup_timeout_s = executor_startup_timeout_s
        self._args = args
        [allocator] = up.allocator_services(args)
        self.allocator = quiet(allocator)
        self.executor: SupervisedProcess | None = None
        self.gateway: SupervisedProcess | None = None

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _start(self) -> None:
        env = hermetic_env()
        self.allocator.start(env)
        self.allocator.wait_ready()
        [executor] = up.executor_services(self._args, self.allocator.address)
        if self._executor_startup_timeout_s is not None:
            executor.startup_timeout_s = self._executor_startup_timeout_s
        self.executor = quiet(executor)
        self.executor.start(env)
        self.executor.wait_ready()
        self.gateway = quiet(up.gateway_service(self._args, self.allocator.address))
        self.gateway.start(env)
        self.gateway.wait_ready()

    def stop(self) -> None:
        """Gateway, executor, allocator: nobody loses the service it depends on while it works."""
        for child in (self.gateway, self.executor, self.allocator):
            if child is not None:
                child.stop()

    @property
    def grpc_target(self) -> str:
        assert self.gateway is not None
        return self.gateway.address

    @property
    def http_url(self) -> str:
        assert self.gateway is not None
        return self.gateway.http_url

    @property
    def pids(self) -> dict[str, int]:
        return {child.name.removesuffix("-0"): child.process.pid
                for child in (self.allocator, self.executor, self.gateway)
                if child is not None and child.process is not None}

    def describe(self) -> str:
        return ", ".join(f"{name} pid {pid}" for name, pid in self.pids.items())


def quiet(child: SupervisedProcess) -> SupervisedProcess:
    child.echo = False
    return child


def hermetic_env() -> dict[str, str]:
    """The supervisor's environment without PAGEDSERVE_*, keeping KEPT_VARIABLES."""
    return supervisor_env({key: os.environ[key] for key in KEPT_VARIABLES if key in os.environ})


def stolen_seconds() -> float | None:
    """CPU time the hypervisor has given other guests while this machine's cores wanted to run,
    summed over its cores (Linux's /proc/stat "steal"; None elsewhere). On a shared virtual
    machine it is what no process of ours could use, whatever it was doing."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far (Linux's /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

