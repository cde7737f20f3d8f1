"""The gateway's configuration, from flags and PAGEDSERVE_GATEWAY_* environment variables."""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedserve.common.allocator_shards import parse_allocator_group
from pagedserve.common.config import add_server_flags, env_or, server_options
from pagedserve.common.server import ServerOptions

DEFAULT_PORT = 50051
DEFAULT_HTTP_PORT = 8000
ENV_PREFIX = "PAGEDSERVE_GATEWAY"


@dataclass(slots=True, frozen=True)
class GatewayConfig:
    server: ServerOptions
    # The allocator, or every shard of an allocator group (each is asked about its executors).
    allocator_group: tuple[str, ...]
    # Presented to the allocator and the executors.
    service_token: str
    tls_ca: str
    max_running: int
    max_queued: int
    refresh_s: float
    log_level: str
    http_port: int
    # Client API keys, each accepted on gRPC and HTTP; none: clients need no key.
    api_keys: tuple[str, ...]
    # Browser origins the HTTP API answers CORS requests from; "*" for any.
    allowed_origins: tuple[str, ...] = ("*",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gateway",
        description="pagedserve gateway: text in, text out; routes to executors by KV overlap")
    add_server_flags(parser, ENV_PREFIX, DEFAULT_PORT,
                     token_help="the services' shared token, presented to the allocator and "
                                "the executors (clients use --api-key)",
                     worker_threads=False)
    env = lambda name, default: env_or(f"{ENV_PREFIX}_{name}", default)  # noqa: E731
    parser.add_argument("--allocator", default=env("ALLOCATOR", "127.0.0.1:50052"),
                        help="the allocator's HOST:PORT, or HOST:PORT,HOST:PORT,... for every "
                             "shard of an allocator group; executors are discovered through it "
                             f"(env {ENV_PREFIX}_ALLOCATOR)")
    parser.add_argument("--tls-ca", default=env("TLS_CA", ""),
                        help="PEM CA bundle to verify the allocator's and executors' TLS "
                             f"(env {ENV_PREFIX}_TLS_CA)")
    parser.add_argument("--max-running", type=int, default=env("MAX_RUNNING", 256),
                        help="requests generating at once; more wait in the queue "
                             f"(env {ENV_PREFIX}_MAX_RUNNING)")
    parser.add_argument("--max-queued", type=int, default=env("MAX_QUEUED", 256),
                        help="requests waiting at most; beyond, RESOURCE_EXHAUSTED at once "
                             f"(env {ENV_PREFIX}_MAX_QUEUED)")
    parser.add_argument("--http-port", type=int, default=env("HTTP_PORT", DEFAULT_HTTP_PORT),
                        help="port of the OpenAI-compatible HTTP API, 0 picks a free one "
                             f"(env {ENV_PREFIX}_HTTP_PORT)")
    parser.add_argument("--api-key", action="append", dest="api_keys", default=None,
                        help="a key clients must present as 'Authorization: Bearer KEY' on gRPC "
                             "and HTTP; repeat for several (env PAGEDSERVE_GATEWAY_API_KEYS, "
                             "comma-separated)")
    parser.add_argument("--allowed-origins", default=env("ALLOWED_ORIGINS", "*"),
                        help="comma-separated browser origins the HTTP API allows (CORS), "
                             "* for any, empty for none "
                             f"(env {ENV_PREFIX}_ALLOWED_ORIGINS)")
    parser.add_argument("--refresh-s", type=float, default=env("REFRESH_S", 1.0),
                        help="seconds between looks at the allocator's executor list "
                             f"(env {ENV_PREFIX}_REFRESH_S)")
    return parser


def parse_config(argv: Sequence[str] | None = None) -> GatewayConfig:
    args = build_parser().parse_args(argv)
    for name in ("max_running", "max_queued"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if not args.refresh_s > 0:
        raise SystemExit(f"--refresh-s must be positive, got {args.refresh_s}")
    if not 0 <= args.http_port <= 65535:
        raise SystemExit(f"--http-port must be between 0 (pick a free one) and 65535, "
                         f"got {args.http_port}")
    try:
        allocator_group = parse_allocator_group(args.allocator)
    except ValueError as error:
        raise SystemExit(f"--allocator: {error}") from None
    api_keys = tuple(args.api_keys if args.api_keys is not None
                     else env_or(f"{ENV_PREFIX}_API_KEYS", "").split(","))
    api_keys = tuple(key.strip() for key in api_keys if key.strip())
    server = server_options(args)
    # --auth-token (PAGEDSERVE_AUTH_TOKEN) is the services' shared token: the gateway presents
    # it to the allocator and executors. Its own clients authenticate with API keys instead.
    server = replace(server, auth_token="")
    return GatewayConfig(server=server, allocator_group=allocator_group,
                         service_token=args.auth_token, tls_ca=args.tls_ca,
                         max_running=args.max_running, max_queued=args.max_queued,
                         refresh_s=args.refresh_s, log_level=args.log_level,
                         http_port=args.http_port, api_keys=api_keys,
                         allowed_origins=tuple(origin.strip() for origin in
                                               args.allowed_origins.split(",")
                                               if origin.strip()))
