"""`pagedserve up` starts allocator, executors and gateway, streams a demo through the gateway,
shows the pools, and stops them in order: gateway, executors, allocator."""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.cli.printable import printable
from pagedserve.cli.up import parse_args
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
    # The demo ignores end-of-sequence, so it always streams all of its 48 tokens.
    streamed = re.search(r"\((\d+) tokens from a 5-token prompt\)", out)
    assert streamed and int(streamed[1]) == 48, "the demo streamed through the gateway"
    assert "total " in out and out.count("    8192 ") >= 2, "pagedctl stats shows both pools"
    demo_text = out.split("demo generation through the gateway: 'Hello'\n\n", 1)[1].split(
        "\n\n(", 1)[0]
    assert demo_text and all(char.isprintable() or char == "\n" for char in demo_text)
    # The banner's commands run as printed: .venv/bin/pagedserve, not a bare name off PATH.
    generate_line = next(line for line in out.splitlines() if " generate \"Hello\"" in line)
    command = shlex.split(generate_line)[0]
    assert (REPO_ROOT / command).is_file() or command == "pagedserve", generate_line
    order = shutdown_order(out)
    assert order[0] == "gateway" and order[-1] == "allocator"
    assert sorted(order[1:-1]) == ["executor-0", "executor-1"]


def start_serving(*args: str) -> tuple[subprocess.Popen[str], list[str]]:
    """`pagedserve up` in a process group of its own, as a terminal runs it, once it serves."""
    process = subprocess.Popen([sys.executable, "-m", "pagedserve.cli.main", "up",
                                *FREE_PORTS, *args], cwd=REPO_ROOT, env=hermetic_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if "serving; Ctrl-C stops everything" in line:
            break
    return process, lines


def test_ctrl_c_stops_a_serving_stack_gracefully() -> None:
    """SIGINT to `up` alone (as `kill -INT` sends it): the same order as a terminal's Ctrl-C."""
    process, lines = start_serving()
    try:
        process.send_signal(signal.SIGINT)
        rest, errors = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, errors[-3000:]
    assert shutdown_order("".join(lines) + rest) == ["gateway", "executor-0", "allocator"]


def test_up_fails_with_the_log_tail_when_a_service_cannot_start() -> None:
    # A port in use is caught before anything starts (below); a flag the allocator refuses at
    # start is not, and its own words must reach the user.
    run = up(*FREE_PORTS, "--state-url", "http://127.0.0.1:1/0", "--exit-when-ready")
    assert run.returncode == 1
    assert ("allocator exited before it printed its address (exit code 1); last lines of its "
            "log:") in run.stderr
    assert "--state-url must be a redis://, rediss:// or unix:// URL" in run.stderr


def test_ctrl_c_to_the_whole_process_group_stops_in_order() -> None:
    """A terminal's Ctrl-C signals its whole foreground process group. The services are not in
    it, so `up` alone decides the order: gateway, executor, allocator, and the gateway never
    sees its allocator vanish (no UNAVAILABLE)."""
    process, lines = start_serving()
    try:
        os.killpg(process.pid, signal.SIGINT)
        rest, errors = process.communicate(timeout=120)
    finally:
        process.kill()
    output = "".join(lines) + rest
    assert process.returncode == 0, errors[-3000:]
    assert shutdown_order(output) == ["gateway", "executor-0", "allocator"]
    assert "UNAVAILABLE" not in output + errors


def test_the_services_stop_when_up_is_killed() -> None:
    """`kill -9` of `up` leaves no service behind: each gets SIGTERM when its parent dies."""
    process, lines = start_serving()
    addresses = re.findall(r"127\.0\.0\.1:(\d+)", "".join(
        line for line in lines if line.startswith(("  gateway", "  executors", "  allocator"))))
    assert len(addresses) == 4   # gateway gRPC and HTTP, executor, allocator
    process.kill()
    process.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(port_free(int(p)) for p in addresses):
        time.sleep(0.5)
    assert all(port_free(int(p)) for p in addresses), "a service outlived `up`"


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("flag, what", [("--allocator-port", "the allocator's port"),
                                        ("--port", "the gateway's gRPC port"),
                                        ("--http-port", "the gateway's HTTP port")])
def test_a_port_in_use_stops_up_before_anything_starts(flag: str, what: str) -> None:
    with socket.socket() as taken:  # another `pagedserve up`, say
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = dict(zip(FREE_PORTS[::2], FREE_PORTS[1::2]), **{flag: str(port)})
        run = up(*(arg for item in ports.items() for arg in item), "--exit-when-ready",
                 timeout_s=60)
    assert run.returncode == 1
    assert run.stderr.startswith("pagedserve up: nothing started:\n")
    assert f"{what} {port} is in use (by another `pagedserve up`?): {flag} N moves it" \
        in run.stderr
    assert "--base-port N moves the whole stack" in run.stderr
    assert "make run PORT=N" in run.stderr
    assert run.stdout == "" and "cannot listen" not in run.stderr


def test_base_port_moves_every_port_and_a_flag_moves_one() -> None:
    def ports(*argv: str) -> tuple[int, int, int, int]:
        args = parse_args(argv)
        return args.port, args.allocator_port, args.executor_port, args.http_port

    assert ports() == (50051, 50052, 50053, 8000)
    assert ports("--base-port", "60000") == (60000, 60001, 60002, 60100)
    assert ports("--base-port", "60000", "--http-port", "9000") == (60000, 60001, 60002, 9000)
    assert ports("--allocator-port", "7000") == (50051, 7000, 50053, 8000)


def test_base_port_runs_the_stack_on_the_moved_ports() -> None:
    # A free block of ports: B, B+1, B+2 and B+100. Tests running beside this one hold ports
    # too, so a block the OS suggests can be taken in part: try a few.
    for _ in range(20):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if all(port_free(base + offset) for offset in (0, 1, 2, 100)):
            break
    else:
        pytest.skip("no free block of ports here")
    run = up("--base-port", str(base), "--exit-when-ready")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"gateway    127.0.0.1:{base} (gRPC)   http://127.0.0.1:{base + 100}/v1" in run.stdout
    assert f"executors  127.0.0.1:{base + 2}\n" in run.stdout
    assert f"allocator  127.0.0.1:{base + 1}\n" in run.stdout


def test_printable_escapes_control_characters_only() -> None:
    assert printable("plain text, ünïcödé, 中文, 🎉\nnext\tline") == \
        "plain text, ünïcödé, 中文, 🎉\nnext\tline"
    assert printable("\x1b[31mred\x0e\x06\x7f\r") == "\\x1b[31mred\\x0e\\x06\\x7f\\x0d"
    assert printable("\x9b C1 \ud800") == "\\x9b C1 \\ud800"


def test_generate_escapes_control_bytes(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`pagedserve generate` writes what the model sent, control characters escaped."""
    from pagedserve.cli import generate

    class Delta:
        def __init__(self, text: str, finish_reason: str | None = None) -> None:
            self.text, self.finish_reason, self.index, self.error = text, finish_reason, 0, ""

    assert generate.print_streamed(iter([Delta("a\x1b(0b\n"), Delta("c\x0e", "stop")])) == []
    assert capsys.readouterr().out == "a\\x1b(0b\nc\\x0e\n"
    assert generate.print_finished(iter([Delta("x\x07"), Delta("y", "length")])) == []
    assert capsys.readouterr().out == "--- completion 0 ---\nx\\x07y\n"


def test_an_executor_that_cannot_start_fails_up_with_its_log(tmp_path) -> None:
    run = up(*FREE_PORTS, "--model", str(tmp_path / "no-such-model"), "--exit-when-ready")
    assert run.returncode == 1
    assert "executor-0 exited before it printed its address (exit code 1)" in run.stderr
    assert "no-such-model" in run.stderr
    assert "received SIGTERM" in run.stdout, "the allocator already running was stopped"


def test_up_with_a_state_url_runs_a_durable_allocator(redis_server: RedisProcess) -> None:
    run = up(*FREE_PORTS, "--state-url", redis_server.url, "--exit-when-ready")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"state in {redis_server.url}, journal at" in run.stdout


def test_up_with_allocator_shards_starts_a_group_each_shard_in_its_own_namespace(
        redis_server: RedisProcess) -> None:
    run = up(*FREE_PORTS, "--allocator-shards", "2", "--executors", "2", "--state-url",
             redis_server.url, "--demo", "Hello", "--exit-when-ready")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    group = next(line for line in out.splitlines() if line.startswith("  allocators "))
    shards = group.split()[1].split(",")
    assert len(shards) == 2 and all(shard.startswith("127.0.0.1:") for shard in shards)
    assert f"--target {','.join(shards)} stats" in out, "the banner's pagedctl asks the group"
    assert "total " in out and out.count("    8192 ") >= 2, "pagedctl stats shows both pools"
    # up numbers its executors (--executor-index), so the two land one on each shard, which
    # their ids (HOSTNAME-PORT) would do only half the time; and each shard journals under its
    # own namespace: shard 0 the default one, shard 1 its own.
    assert all(f"(placed by executor index {k})" in out for k in (0, 1)), out[-3000:]
    client = redis_server.client()
    journals = client.keys("pagedserve:allocator*:journal")
    assert sorted(journals) == [b"pagedserve:allocator:journal",
                                b"pagedserve:allocator:shard-1:journal"]
    # Each executor registered its number, which its shard journaled (a second executor with
    # the same number would have been refused).
    registered = []
    for journal in journals:
        for _, fields in client.xrange(journal):
            if fields[b"kind"] == b"register":
                request = apb.RegisterExecutorRequest.FromString(fields[b"body"])
                registered.append(request.executor_index)
    assert sorted(registered) == [0, 1]
    order = shutdown_order(out)
    assert order[0] == "gateway"
    assert sorted(order[-2:]) == ["allocator-0", "allocator-1"], "the allocators go last"
