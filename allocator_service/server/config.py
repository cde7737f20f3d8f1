"""The allocator's configuration, from flags and PAGEDSERVE_ALLOCATOR_* environment variables."""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from allocator_service.server.executor_tokens import ExecutorTokens, load_executor_tokens
from pagedserve.common.config import add_server_flags, env_or, redacted, server_options
from pagedserve.common.server import ServerOptions

DEFAULT_PORT = 50052
ENV_PREFIX = "PAGEDSERVE_ALLOCATOR"


@dataclass(slots=True, frozen=True)
class StateStoreOptions:
    # "" keeps state in memory; redis://[:password@]host:port/db makes it durable.
    url: str
    namespace: str
    snapshot_every: int
    events_max: int
    timeout_s: float


@dataclass(slots=True, frozen=True)
class AllocatorConfig:
    server: ServerOptions
    lease_ttl_s: float
    step_log_size: int
    state: StateStoreOptions
    log_level: str
    # Each executor's own token, binding its calls to its pool; None: the shared token only.
    executor_tokens: ExecutorTokens | None = None
    # The Step channel's port on the gRPC host: 0 lets the OS choose, -1 serves no channel.
    step_port: int = 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m allocator_service",
        description="pagedserve allocator: owns every executor's KV-cache blocks")
    add_server_flags(parser, ENV_PREFIX, DEFAULT_PORT)
    parser.add_argument("--lease-ttl", type=float, default=env_or(f"{ENV_PREFIX}_LEASE_TTL", 10.0),
                        help="seconds without a heartbeat or step before a pool is reclaimed "
                             f"(env {ENV_PREFIX}_LEASE_TTL)")
    parser.add_argument("--step-log-size", type=int,
                        default=env_or(f"{ENV_PREFIX}_STEP_LOG_SIZE", 64),
                        help="recent step results kept per executor to answer retries "
                             f"(env {ENV_PREFIX}_STEP_LOG_SIZE)")
    parser.add_argument("--step-port", type=int, default=env_or(f"{ENV_PREFIX}_STEP_PORT", 0),
                        help="port of the Step channel, a cheaper transport for executors' "
                             "Steps (docs/allocator.md), on the --host of the gRPC port: 0 "
                             "picks a free one, -1 serves none (Steps then go over gRPC) "
                             f"(env {ENV_PREFIX}_STEP_PORT)")
    parser.add_argument("--executor-tokens", default=env_or(f"{ENV_PREFIX}_EXECUTOR_TOKENS", ""),
                        help="file of 'EXECUTOR_ID TOKEN' lines: each executor calls with its "
                             "own token (its --allocator-token) and may then register, renew "
                             "and step only its own pool; needs --auth-token for everyone else "
                             f"(env {ENV_PREFIX}_EXECUTOR_TOKENS)")
    durable = parser.add_argument_group("durability (Redis)")
    durable.add_argument("--state-url", default=env_or(f"{ENV_PREFIX}_STATE_URL", ""),
                         help="redis://[:PASSWORD@]HOST:PORT/DB (or rediss:// for TLS): journal "
                              "every change there before replying and recover from it on start; "
                              f"empty keeps state in memory (env {ENV_PREFIX}_STATE_URL)")
    durable.add_argument("--state-namespace",
                         default=env_or(f"{ENV_PREFIX}_STATE_NAMESPACE", "pagedserve:allocator"),
                         help="prefix of every Redis key this allocator writes "
                              f"(env {ENV_PREFIX}_STATE_NAMESPACE)")
    durable.add_argument("--snapshot-every", type=int,
                         default=env_or(f"{ENV_PREFIX}_SNAPSHOT_EVERY", 2_000),
                         help="journal entries between snapshots (bounds replay on restart) "
                              f"(env {ENV_PREFIX}_SNAPSHOT_EVERY)")
    durable.add_argument("--events-max", type=int,
                         default=env_or(f"{ENV_PREFIX}_EVENTS_MAX", 100_000),
                         help="KV events kept (the stream is capped at about this many) "
                              f"(env {ENV_PREFIX}_EVENTS_MAX)")
    durable.add_argument("--state-timeout", type=float,
                         default=env_or(f"{ENV_PREFIX}_STATE_TIMEOUT", 2.0),
                         help="seconds a Redis call may take before it counts as an outage "
                              f"(env {ENV_PREFIX}_STATE_TIMEOUT)")
    return parser


def parse_config(argv: Sequence[str] | None = None) -> AllocatorConfig:
    args = build_parser().parse_args(argv)
    if not 0.1 <= args.lease_ttl <= 86400:
        raise SystemExit(f"--lease-ttl must be between 0.1 and 86400 seconds, got {args.lease_ttl}")
    if not 1 <= args.step_log_size <= 100_000:
        raise SystemExit(f"--step-log-size must be between 1 and 100000, got {args.step_log_size}")
    if args.state_url and urlsplit(args.state_url).scheme not in ("redis", "rediss", "unix"):
        raise SystemExit(f"--state-url must be a redis://, rediss:// or unix:// URL, got "
                         f"{redacted(args.state_url)!r}")
    if not -1 <= args.step_port <= 65535:
        raise SystemExit(f"--step-port must be between -1 (no Step channel), 0 (pick a free "
                         f"one) and 65535, got {args.step_port}")
    if args.snapshot_every < 1:
        raise SystemExit(f"--snapshot-every must be at least 1, got {args.snapshot_every}")
    if args.events_max < 1:
        raise SystemExit(f"--events-max must be at least 1, got {args.events_max}")
    if not 0.05 <= args.state_timeout <= 60:
        raise SystemExit(f"--state-timeout must be between 0.05 and 60 seconds, got "
                         f"{args.state_timeout}")
    executor_tokens = None
    if args.executor_tokens:
        if not args.auth_token:
            raise SystemExit("--executor-tokens needs --auth-token too: the gateway and "
                             "operators call with the shared token")
        try:
            executor_tokens = load_executor_tokens(args.executor_tokens, args.auth_token)
        except ValueError as error:
            raise SystemExit(str(error)) from None
    state = StateStoreOptions(args.state_url, args.state_namespace, args.snapshot_every,
                              args.events_max, args.state_timeout)
    return AllocatorConfig(server=server_options(args), lease_ttl_s=args.lease_ttl,
                           step_log_size=args.step_log_size, state=state,
                           log_level=args.log_level, executor_tokens=executor_tokens,
                           step_port=args.step_port)
