"""`pagedserve up`: the whole stack on this machine: allocator, N executors and the gateway as
supervised child processes on loopback.

Start-up goes in dependency order, each step waiting for gRPC health SERVING: the allocator,
then every executor (in parallel: each loads its model), then the gateway, which is SERVING once
it has found them. Every port is checked first: a port in use stops `up` before anything starts,
with the flag that moves it. The endpoints are printed, optionally a demo generation streams
through the gateway, and `pagedctl stats` shows the pools.

Ports: gateway gRPC 50051, allocator 50052, executor i 50053 + i, HTTP 8000. `--base-port B`
moves the whole stack: gateway gRPC B, allocator B + 1, executor i B + 2 + i, HTTP B + 100;
--port, --allocator-port, --executor-port and --http-port move one service.
`--allocator-shards S` starts an allocator group of S allocators: the first on the allocator
port, the others on free ports, each with its own Redis namespace when --state-url is given;
every executor registers with the shard its id hashes to.

The services run in sessions of their own, so a Ctrl-C in the terminal reaches only `up`, which
shuts down in the reverse order: the gateway drains its streams, the executors finish or cancel
theirs, the allocator goes last, so no service ever loses the one it depends on while it still
works. SIGTERM does the same; if `up` itself dies, its services get SIGTERM (Linux). A service
that dies, at start or later, stops the others and makes `up` exit 1 with that service's log
tail.
"""
from __future__ import annotations

import argparse
import errno
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from pagedserve.cli import pagedctl
from pagedserve.cli.printable import printable
from pagedserve.gateway_client import GatewayClient
from pagedserve.supervisor.supervised import ServiceStartError, SupervisedProcess

DEMO_MAX_TOKENS = 48
EMBEDDED_NOTE = ("(the embedded default model has random weights, so its text is noise; "
                 "--model DIR serves a real checkpoint)")
HOST = "127.0.0.1"
# Today's layout, and where each port goes relative to --base-port.
DEFAULT_PORTS = {"port": 50051, "allocator_port": 50052, "executor_port": 50053,
                 "http_port": 8000}
BASE_OFFSETS = {"port": 0, "allocator_port": 1, "executor_port": 2, "http_port": 100}
# The allocator's own default (allocator_service/server/config.py); shards add a suffix.
DEFAULT_STATE_NAMESPACE = "pagedserve:allocator"
BASE_PORT_HINT = ("--base-port N moves the whole stack (gateway N, allocator N+1, executors "
                  "N+2.., HTTP N+100; `make run PORT=N` passes it)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedserve up", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[2])
    parser.add_argument("--executors", type=int, default=1, help="executors to start")
    parser.add_argument("--allocator-shards", type=int, default=1,
                        help="allocators in the allocator group: each owns the pools of the "
                             "executors whose ids hash to it (default 1)")
    parser.add_argument("--model", default="",
                        help="checkpoint directory every executor serves (default: the "
                             "embedded model)")
    parser.add_argument("--state-url", default="",
                        help="redis://HOST:PORT/DB: the allocator's durable state (default: "
                             "in memory)")
    parser.add_argument("--base-port", type=int, default=None,
                        help="move every port: gateway gRPC on it, allocator +1, executor i "
                             "+2+i, HTTP +100 (default: 50051, 50052, 50053, 8000)")
    parser.add_argument("--port", type=int, default=None,
                        help="the gateway's gRPC port (default 50051, or the base port)")
    parser.add_argument("--http-port", type=int, default=None,
                        help="the gateway's OpenAI-compatible HTTP port (default 8000, or the "
                             "base port + 100)")
    parser.add_argument("--allocator-port", type=int, default=None,
                        help="the allocator's port (default 50052, or the base port + 1)")
    parser.add_argument("--executor-port", type=int, default=None,
                        help="the first executor's port; executor i listens on it + i "
                             "(0: free ports; default 50053, or the base port + 2)")
    parser.add_argument("--devices", default="",
                        help="comma-separated devices handed out to the executors in turn, "
                             "e.g. cuda:0,cuda:1 (default: the executor's --device, cpu)")
    parser.add_argument("--executor-args", default="",
                        help="more executor flags, as one string, e.g. '--num-blocks 512'")
    parser.add_argument("--auth-token", default="",
                        help="the services' shared bearer token")
    parser.add_argument("--api-key", action="append", default=[],
                        help="a key the gateway's clients must present (repeatable)")
    parser.add_argument("--demo", default="",
                        help="once up, stream this prompt through the gateway")
    parser.add_argument("--exit-when-ready", action="store_true",
                        help="stop everything once the stack is up (smoke tests, timing)")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments with every port resolved: its flag, else from --base-port, else today's
    default."""
    args = build_parser().parse_args(argv)
    for name, default in DEFAULT_PORTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default if args.base_port is None
                    else args.base_port + BASE_OFFSETS[name])
    return args


def planned_ports(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(what, port, the flag that moves it) for every fixed port the stack will listen on."""
    plan = [("the gateway's gRPC port", args.port, "--port"),
            ("the gateway's HTTP port", args.http_port, "--http-port"),
            ("the allocator's port", args.allocator_port, "--allocator-port")]
    if args.executor_port:
        plan += [(f"executor-{i}'s port", args.executor_port + i, "--executor-port")
                 for i in range(args.executors)]
    return [(what, port, flag) for what, port, flag in plan if port]


def port_problems(args: argparse.Namespace) -> list[str]:
    """What stands in the way of the planned ports: a port given twice, or one in use."""
    problems, seen = [], {}
    for what, port, flag in planned_ports(args):
        if port in seen:
            problems.append(f"{what} and {seen[port]} are both {port}: move one with {flag}")
            continue
        seen[port] = what
        with socket.socket() as probe:
            # As a listening service binds: a port left in TIME_WAIT is free, a listener is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((HOST, port))
            except OSError as error:
                reason = ("is in use (by another `pagedserve up`?)"
                          if error.errno == errno.EADDRINUSE else f"cannot be used ({error})")
                problems.append(f"{what} {port} {reason}: {flag} N moves it")
    return problems


def allocator_services(args: argparse.Namespace, own_session: bool = False
                       ) -> list[SupervisedProcess]:
    """The allocator group: shard 0 on the allocator port with the default Redis namespace (a
    single allocator is exactly today's), shard k on a free port with a namespace of its own."""
    allocators = []
    for index in range(args.allocator_shards):
        durable = ["--state-url", args.state_url] if args.state_url else []
        if durable and index:
            durable += ["--state-namespace", f"{DEFAULT_STATE_NAMESPACE}:shard-{index}"]
        allocators.append(SupervisedProcess(
            "allocator" if args.allocator_shards == 1 else f"allocator-{index}", [
                sys.executable, "-m", "allocator_service",
                "--port", str(args.allocator_port if index == 0 else 0),
                *_token(args), *durable],
            ready_prefix="allocator listening on ", echo=True, own_session=own_session))
    return allocators


def executor_services(args: argparse.Namespace, allocator: str, own_session: bool = False
                      ) -> list[SupervisedProcess]:
    """The executors, for the allocator at `allocator` (HOST:PORT, or the group's
    HOST:PORT,HOST:PORT,..., known once it listens)."""
    devices = [device for device in args.devices.split(",") if device]
    executors = []
    for index in range(args.executors):
        port = args.executor_port + index if args.executor_port else 0
        executors.append(SupervisedProcess(f"executor-{index}", [
            sys.executable, "-m", "executor_service", "--port", str(port),
            "--allocator", allocator, "--executor-index", str(index), *_token(args),
            *(["--allocator-token", args.auth_token] if args.auth_token else []),
            *(["--model", args.model] if args.model else []),
            *(["--device", devices[index % len(devices)]] if devices else []),
            *shlex.split(args.executor_args)],
            ready_prefix="executor listening on ", echo=True, own_session=own_session))
    return executors


def gateway_service(args: argparse.Namespace, allocator: str, own_session: bool = False
                    ) -> SupervisedProcess:
    return SupervisedProcess("gateway", [
        sys.executable, "-m", "gateway", "--port", str(args.port),
        "--http-port", str(args.http_port), "--allocator", allocator, *_token(args),
        *(arg for key in args.api_key for arg in ("--api-key", key))],
        ready_prefix="gateway listening on ", http_prefix="gateway HTTP API on ", echo=True,
        own_session=own_session)


def _token(args: argparse.Namespace) -> list[str]:
    return ["--auth-token", args.auth_token] if args.auth_token else []


def start_in_parallel(children: Sequence[SupervisedProcess]) -> None:
    for child in children:
        child.start()
    failures: list[ServiceStartError] = []

    def wait(child: SupervisedProcess) -> None:
        try:
            child.wait_ready()
        except ServiceStartError as failure:
            failures.append(failure)

    waiters = [threading.Thread(target=wait, args=(child,), daemon=True) for child in children]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join()
    if failures:
        raise failures[0]


def console_command(name: str) -> str:
    """How the user can run the console script `name` from here: its bare name when PATH finds
    this installation's, else its path (relative when it is under the current directory, as
    `.venv/bin/pagedserve` is after `make run`), else `python -m`."""
    script = Path(sys.executable).parent / name
    if not script.exists():
        module = "pagedserve.cli.main" if name == "pagedserve" else f"pagedserve.cli.{name}"
        return f"{shlex.quote(sys.executable)} -m {module}"
    found = shutil.which(name)
    if found and Path(found).resolve() == script.resolve():
        return name
    try:
        return shlex.quote(str(script.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(script))


def announce(allocator_group: str, executors: Sequence[SupervisedProcess],
             gateway: SupervisedProcess) -> None:
    what = "allocators" if "," in allocator_group else "allocator "
    print(f"\npagedserve is up:\n"
          f"  gateway    {gateway.address} (gRPC)   {gateway.http_url}/v1 (OpenAI HTTP)\n"
          f"  executors  {', '.join(e.address for e in executors)}\n"
          f"  {what} {allocator_group}\n\n"
          f"  {console_command('pagedserve')} generate \"Hello\" --target {gateway.address}\n"
          f"  {console_command('pagedctl')} --target {allocator_group} stats\n", flush=True)


def demo(gateway: SupervisedProcess, prompt: str, api_key: str) -> None:
    print(f"demo generation through the gateway: {prompt!r}\n", flush=True)
    with GatewayClient(gateway.address, api_key=api_key, timeout_s=120) as client:
        # Sampled from random weights, the demo would draw end-of-sequence early now and then;
        # it shows a whole generation instead.
        generation = client.stream(prompt, max_tokens=DEMO_MAX_TOKENS, ignore_eos=True)
        for delta in generation:
            print(printable(delta.text), end="", flush=True)
    usage = generation.usage
    print(f"\n\n({usage.completion_tokens} tokens from a {usage.prompt_tokens}-token prompt)\n"
          if usage else "\n", flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def up(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    for name in ("executors", "allocator_shards"):
        if getattr(args, name) < 1:
            print(f"pagedserve up: --{name.replace('_', '-')} must be at least 1",
                  file=sys.stderr)
            return 2
    problems = port_problems(args)
    if problems:
        print("pagedserve up: nothing started:\n" + "\n".join(f"  {p}" for p in problems)
              + f"\n  {BASE_PORT_HINT}", file=sys.stderr)
        return 1
    allocators = allocator_services(args, own_session=True)
    executors: list[SupervisedProcess] = []
    gateway: SupervisedProcess | None = None
    # The services are in their own sessions, so Ctrl-C (and SIGTERM) reach only us: both
    # interrupt whatever we are doing, and the `finally` stops the services in order.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        start_in_parallel(allocators)
        # Every executor and the gateway get the same list: it decides which shard owns what.
        allocator_group = ",".join(allocator.address for allocator in allocators)
        executors = executor_services(args, allocator_group, own_session=True)
        start_in_parallel(executors)
        gateway = gateway_service(args, allocator_group, own_session=True)
        gateway.start()
        gateway.wait_ready()
        announce(allocator_group, executors, gateway)
        if args.demo:
            demo(gateway, args.demo, args.api_key[0] if args.api_key else "")
            if not args.model:
                print(EMBEDDED_NOTE + "\n", flush=True)
        pagedctl.main(["--target", allocator_group, "--token", args.auth_token, "stats"])
        if not args.exit_when_ready:
            print("\nserving; Ctrl-C stops everything", flush=True)
        while not args.exit_when_ready:
            time.sleep(0.5)
            for child in (*allocators, *executors, gateway):
                if child.exited:
                    raise child.failure("exited unexpectedly")
        return 0
    except KeyboardInterrupt:
        return 0
    except ServiceStartError as failure:
        print(f"pagedserve up: {failure}", file=sys.stderr)
        return 1
    except grpc.RpcError as error:
        print(f"pagedserve up: the demo generation failed: {error.code().name}: "
              f"{error.details()}", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C must not cut the orderly shutdown short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        shut_down(allocators, executors, gateway)


def shut_down(allocators: Sequence[SupervisedProcess], executors: Sequence[SupervisedProcess],
              gateway: SupervisedProcess | None) -> None:
    """Gateway first (it drains), then the executors together, the allocators last."""
    print("\nshutting down: gateway, executors, allocator" + "s" * (len(allocators) > 1),
          flush=True)
    if gateway is not None:
        gateway.stop()
    for group in (executors, allocators):
        for child in group:
            child.request_stop()
        for child in group:
            child.stop()
