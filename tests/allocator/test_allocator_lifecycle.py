"""Start-up and shutdown of the real allocator process: SIGTERM shuts it down in order (exit 0),
even right after the ready line; an out-of-range flag stops start-up with a message."""
from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import pytest

from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import (REPO_ROOT, AllocatorProcess, AllocatorStartError,
                                                   hermetic_env)
from tests.support.allocator_wire import register

pytestmark = pytest.mark.timeout(60)


def test_sigterm_stops_the_server_gracefully_with_exit_code_0(
        start_allocator: Callable[..., AllocatorProcess]) -> None:
    process = start_allocator()
    register(pb_grpc.AllocatorStub(process.channel()), "before-shutdown")
    started = time.monotonic()
    process.process.send_signal(signal.SIGTERM)
    assert process.process.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    process.stop()  # joins the log readers
    log = process.stderr_tail()
    assert "received SIGTERM, shutting down" in log and "stopped" in log
    assert "Traceback" not in log


def test_sigterm_right_after_the_ready_line_still_exits_gracefully() -> None:
    """The ready line tells launchers (`pagedserve up`, AllocatorProcess) the server can be
    managed, so a SIGTERM sent as soon as it appears must shut down in order (exit 0).

    start() installs the signal handlers before the line is printed; otherwise such a SIGTERM
    would meet the default disposition and kill the process (-15).
    """
    exit_codes = []
    logs = []
    for _ in range(10):
        with tempfile.TemporaryFile(mode="w+") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "allocator_service", "--host", "127.0.0.1", "--port", "0"],
                cwd=REPO_ROOT, env=hermetic_env(), stdout=subprocess.PIPE, stderr=stderr,
                text=True)
            try:
                assert process.stdout is not None
                assert process.stdout.readline().startswith("allocator listening on 127.0.0.1:")
                process.send_signal(signal.SIGTERM)
                exit_codes.append(process.wait(timeout=10))
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                process.stdout.close()
            stderr.seek(0)
            logs.append(stderr.read()[-2000:])
    failed = [log for code, log in zip(exit_codes, logs) if code != 0]
    assert exit_codes == [0] * 10, "stderr of the first failure:\n" + (failed or [""])[0]


def test_out_of_range_flag_stops_start_up_with_a_message() -> None:
    with pytest.raises(AllocatorStartError) as caught:
        AllocatorProcess("--lease-ttl", "0")
    assert "exit code 1" in str(caught.value)
    assert "--lease-ttl must be between 0.1 and 86400 seconds, got 0.0" in str(caught.value)
