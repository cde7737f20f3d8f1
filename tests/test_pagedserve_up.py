"""`pagedserve up` starts the stack (today: the allocator), shows its stats, stops in order."""
from __future__ import annotations

import socket
import subprocess
import sys

from allocator_process import REPO_ROOT, hermetic_env
from redis_process import RedisProcess


def test_up_starts_the_allocator_shows_stats_and_stops_cleanly() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pagedserve.cli.main", "up", "--allocator-port", "0",
         "--exit-when-ready"],
        cwd=REPO_ROOT, env=hermetic_env(), capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "pagedserve is up:" in run.stdout
    assert "no executor has registered a pool yet" in run.stdout
    assert "[allocator]" in run.stdout and "received SIGTERM, shutting down" in run.stdout


def test_up_fails_with_the_log_tail_when_a_service_cannot_start() -> None:
    with socket.socket() as taken:  # the allocator's port is in use: it must exit at start
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "-m", "pagedserve.cli.main", "up", "--allocator-port", str(port),
             "--exit-when-ready"],
            cwd=REPO_ROOT, env=hermetic_env(), capture_output=True, text=True, timeout=90)
    assert run.returncode == 1
    assert "allocator exited with code 1; last lines of its log:" in run.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in run.stderr


def test_up_with_a_state_url_runs_a_durable_allocator(redis_server: RedisProcess) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pagedserve.cli.main", "up", "--allocator-port", "0",
         "--state-url", redis_server.url, "--exit-when-ready"],
        cwd=REPO_ROOT, env=hermetic_env(), capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"state in {redis_server.url}, journal at 0" in run.stdout
