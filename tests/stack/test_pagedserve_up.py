"""`pagedserve up` starts allocator, executors and gateway, streams a demo through the gateway,
shows the pools, and stops them in order: gateway, executors, allocator."""
from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys

from pagedserve.supervisor.redis_server import RedisProcess
from pagedserve.supervisor.service_process import REPO_ROOT, hermetic_env

FREE_PORTS = ["--allocator-port", "0", "--executor-port", "0", "--port", "0",
              "--http-port", "0"]


def up(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pagedserve.cli.main", "up", *args],
                          cwd=REPO_ROOT, env=hermetic_env(), capture_output=True, text=True,
                          timeout=timeout_s)


def shutdown_order(stdout: str) -> list[str]:
    """The services in the order their SIGTERM arrived."""
    lines = [line for line in stdout.splitlines() if "received SIGTERM" in line]
    return list(dict.fromkeys(line[1:line.index("]")] for line in lines))


def test_up_starts_the_stack_streams_a_demo_and_stops_in_order() -> None:
    run = up(*FREE_PORTS, "--executors", "2", "--demo", "Hello", "--exit-when-ready")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    assert "pagedserve is up:" in out
    executors_line = next(line for line in out.splitlines() if "  executors  " in line)
    assert executors_line.count("127.0.0.1:") == 2
    # The demo samples (temperature 1) from random weights: about one run in eight draws the
    # end-of-sequence token before its 48 tokens.
    streamed = re.search(r"\((\d+) tokens from a 5-token prompt\)", out)
    assert streamed and 1 <= int(streamed[1]) <= 48, "the demo streamed through the gateway"
    assert "total " in out and out.count("    8192 ") >= 2, "pagedctl stats shows both pools"
    order = shutdown_order(out)
    assert order[0] == "gateway" and order[-1] == "allocator"
    assert sorted(order[1:-1]) == ["executor-0", "executor-1"]


def test_ctrl_c_stops_a_serving_stack_gracefully() -> None:
    process = subprocess.Popen([sys.executable, "-m", "pagedserve.cli.main", "up",
                                *FREE_PORTS], cwd=REPO_ROOT, env=hermetic_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if "serving; Ctrl-C stops everything" in line:
                break
        process.send_signal(signal.SIGINT)
        rest, errors = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, errors[-3000:]
    assert shutdown_order("".join(lines) + rest) == ["gateway", "executor-0", "allocator"]


def test_up_fails_with_the_log_tail_when_a_service_cannot_start() -> None:
    with socket.socket() as taken:  # the allocator's port is in use: it must exit at start
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = up("--allocator-port", str(port), "--exit-when-ready")
    assert run.returncode == 1
    assert "allocator exited with code 1; last lines of its log:" in run.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in run.stderr


def test_an_executor_that_cannot_start_fails_up_with_its_log(tmp_path) -> None:
    run = up(*FREE_PORTS, "--model", str(tmp_path / "no-such-model"), "--exit-when-ready")
    assert run.returncode == 1
    assert "executor-0 exited with code" in run.stderr
    assert "no-such-model" in run.stderr
    assert "received SIGTERM" in run.stdout, "the allocator already running was stopped"


def test_up_with_a_state_url_runs_a_durable_allocator(redis_server: RedisProcess) -> None:
    run = up(*FREE_PORTS, "--state-url", redis_server.url, "--exit-when-ready")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"state in {redis_server.url}, journal at" in run.stdout
