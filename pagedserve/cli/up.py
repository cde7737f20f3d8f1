"""`pagedserve up`: the whole stack on this machine: allocator, N executors and the gateway as
supervised child processes on loopback.

Start-up goes in dependency order, each step waiting for gRPC health SERVING: the allocator,
then every executor (in parallel: each loads its model), then the gateway, which is SERVING once
it has found them. The endpoints are printed, optionally a demo generation streams through the
gateway, and `pagedctl stats` shows the pools. Ctrl-C or SIGTERM shuts down in the reverse
order: the gateway drains its streams, the executors finish or cancel theirs, the allocator
goes last, so no service ever loses the one it depends on while it still works. A service that
dies, at start or later, stops the others and makes `up` exit 1 with that service's log tail.
"""
from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from collections.abc import Sequence

import grpc

from pagedserve.cli import pagedctl
from pagedserve.cli.child_service import ChildService, ServiceFailed
from pagedserve.gateway_client import GatewayClient

DEMO_MAX_TOKENS = 48
EMBEDDED_NOTE = ("(the embedded default model has random weights, so its text is noise; "
                 "--model DIR serves a real checkpoint)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedserve up", description=__doc__.split("\n\n")[0])
    parser.add_argument("--executors", type=int, default=1, help="executors to start")
    parser.add_argument("--model", default="",
                        help="checkpoint directory every executor serves (default: the "
                             "embedded model)")
    parser.add_argument("--state-url", default="",
                        help="redis://HOST:PORT/DB: the allocator's durable state (default: "
                             "in memory)")
    parser.add_argument("--port", type=int, default=50051, help="the gateway's gRPC port")
    parser.add_argument("--http-port", type=int, default=8000,
                        help="the gateway's OpenAI-compatible HTTP port")
    parser.add_argument("--allocator-port", type=int, default=50052, help="the allocator's port")
    parser.add_argument("--executor-port", type=int, default=50053,
                        help="the first executor's port; executor i listens on it + i "
                             "(0: free ports)")
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


def allocator_service(args: argparse.Namespace) -> ChildService:
    return ChildService("allocator", [
        sys.executable, "-m", "allocator_service", "--port", str(args.allocator_port),
        *_token(args), *(["--state-url", args.state_url] if args.state_url else [])])


def executor_services(args: argparse.Namespace, allocator: str) -> list[ChildService]:
    """The executors, for the allocator at `allocator` (HOST:PORT, known once it listens)."""
    devices = [device for device in args.devices.split(",") if device]
    executors = []
    for index in range(args.executors):
        port = args.executor_port + index if args.executor_port else 0
        executors.append(ChildService(f"executor-{index}", [
            sys.executable, "-m", "executor_service", "--port", str(port),
            "--allocator", allocator, *_token(args),
            *(["--allocator-token", args.auth_token] if args.auth_token else []),
            *(["--model", args.model] if args.model else []),
            *(["--device", devices[index % len(devices)]] if devices else []),
            *shlex.split(args.executor_args)]))
    return executors


def gateway_service(args: argparse.Namespace, allocator: str) -> ChildService:
    return ChildService("gateway", [
        sys.executable, "-m", "gateway", "--port", str(args.port),
        "--http-port", str(args.http_port), "--allocator", allocator, *_token(args),
        *(arg for key in args.api_key for arg in ("--api-key", key))])


def _token(args: argparse.Namespace) -> list[str]:
    return ["--auth-token", args.auth_token] if args.auth_token else []


def start_in_parallel(children: Sequence[ChildService]) -> None:
    for child in children:
        child.start()
    failures: list[ServiceFailed] = []

    def wait(child: ChildService) -> None:
        try:
            child.wait_ready()
        except ServiceFailed as failure:
            failures.append(failure)

    waiters = [threading.Thread(target=wait, args=(child,)) for child in children]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join()
    if failures:
        raise failures[0]


def announce(allocator: ChildService, executors: Sequence[ChildService],
             gateway: ChildService) -> None:
    print(f"\npagedserve is up:\n"
          f"  gateway    {gateway.address} (gRPC)   {gateway.http_url}/v1 (OpenAI HTTP)\n"
          f"  executors  {', '.join(e.address for e in executors)}\n"
          f"  allocator  {allocator.address}\n\n"
          f"  pagedserve generate \"Hello\" --target {gateway.address}\n"
          f"  pagedctl --target {allocator.address} stats\n", flush=True)


def demo(gateway: ChildService, prompt: str, api_key: str) -> None:
    print(f"demo generation through the gateway: {prompt!r}\n", flush=True)
    with GatewayClient(gateway.address, api_key=api_key, timeout_s=120) as client:
        generation = client.stream(prompt, max_tokens=DEMO_MAX_TOKENS)
        for delta in generation:
            print(delta.text, end="", flush=True)
    usage = generation.usage
    print(f"\n\n({usage.completion_tokens} tokens from a {usage.prompt_tokens}-token prompt)\n"
          if usage else "\n", flush=True)


def up(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.executors < 1:
        print("pagedserve up: --executors must be at least 1", file=sys.stderr)
        return 2
    allocator = allocator_service(args)
    executors: list[ChildService] = []
    gateway: ChildService | None = None
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    signal.signal(signal.SIGINT, lambda *_: stop_requested.set())
    try:
        allocator.start()
        allocator.wait_ready()
        executors = executor_services(args, allocator.address)
        start_in_parallel(executors)
        gateway = gateway_service(args, allocator.address)
        gateway.start()
        gateway.wait_ready()
        announce(allocator, executors, gateway)
        if args.demo:
            demo(gateway, args.demo, args.api_key[0] if args.api_key else "")
            if not args.model:
                print(EMBEDDED_NOTE + "\n", flush=True)
        pagedctl.main(["--target", allocator.address, "--token", args.auth_token, "stats"])
        if not args.exit_when_ready:
            print("\nserving; Ctrl-C stops everything", flush=True)
        while not args.exit_when_ready and not stop_requested.wait(0.5):
            for child in (allocator, *executors, gateway):
                if child.exited:
                    raise child.failure(f"exited unexpectedly with code "
                                        f"{child.process.returncode}")
        return 0
    except ServiceFailed as failure:
        print(f"pagedserve up: {failure}", file=sys.stderr)
        return 1
    except grpc.RpcError as error:
        print(f"pagedserve up: the demo generation failed: {error.code().name}: "
              f"{error.details()}", file=sys.stderr)
        return 1
    finally:
        shut_down(allocator, executors, gateway)


def shut_down(allocator: ChildService, executors: Sequence[ChildService],
              gateway: ChildService | None) -> None:
    """Gateway first (it drains), then the executors together, the allocator last."""
    print("\nshutting down: gateway, executors, allocator", flush=True)
    if gateway is not None:
        gateway.stop()
    for executor in executors:
        executor.request_stop()
    for executor in executors:
        executor.stop()
    allocator.stop()
