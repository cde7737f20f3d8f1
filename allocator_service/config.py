"""The allocator's configuration, from flags and PAGEDSERVE_ALLOCATOR_* environment variables."""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from pagedserve.common.config import add_server_flags, env_or, server_options
from pagedserve.common.server import ServerOptions

DEFAULT_PORT = 50052
ENV_PREFIX = "PAGEDSERVE_ALLOCATOR"


@dataclass(slots=True, frozen=True)
class AllocatorConfig:
    server: ServerOptions
    lease_ttl_s: float
    step_log_size: int
    log_level: str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m allocator_service",
        description="pagedserve allocator: owns every executor's KV-cache blocks")
    add_server_flags(parser, ENV_PREFIX, DEFAULT_PORT)
    parser.add_argument("--lease-ttl", type=float, default=env_or(f"{ENV_PREFIX}_LEASE_TTL", 10.0),
                        help="seconds without a heartbeat or step before a pool is reclaimed")
    parser.add_argument("--step-log-size", type=int,
                        default=env_or(f"{ENV_PREFIX}_STEP_LOG_SIZE", 64),
                        help="recent step results kept per executor to answer retries")
    return parser


def parse_config(argv: Sequence[str] | None = None) -> AllocatorConfig:
    args = build_parser().parse_args(argv)
    if not 0.1 <= args.lease_ttl <= 86400:
        raise SystemExit(f"--lease-ttl must be between 0.1 and 86400 seconds, got {args.lease_ttl}")
    if not 1 <= args.step_log_size <= 100_000:
        raise SystemExit(f"--step-log-size must be between 1 and 100000, got {args.step_log_size}")
    return AllocatorConfig(server=server_options(args), lease_ttl_s=args.lease_ttl,
                           step_log_size=args.step_log_size, log_level=args.log_level)
