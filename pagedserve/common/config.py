"""Flags that fall back to environment variables, so compose files and shells configure alike."""
from __future__ import annotations

import argparse
import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pagedserve.common.server import ServerOptions


def env_or(name: str, default: Any) -> Any:
    """The environment's value for `name` (converted to default's type), else default."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return type(default)(raw) if default is not None else raw


TOKEN_HELP = "bearer token every non-health call must carry"


def add_server_flags(parser: argparse.ArgumentParser, prefix: str, default_port: int,
                     token_help: str = TOKEN_HELP, worker_threads: bool = True) -> None:
    """Flags every service shares: where to listen, auth, TLS, workers, logging. `token_help`
    says what the shared token means to this service; a service on an event loop (the gateway)
    has no worker threads to size."""
    parser.add_argument("--host", default=env_or(f"{prefix}_HOST", "127.0.0.1"),
                        help=f"interface to listen on (env {prefix}_HOST)")
    parser.add_argument("--port", type=int, default=env_or(f"{prefix}_PORT", default_port),
                        help=f"port to listen on, 0 picks a free one (env {prefix}_PORT)")
    parser.add_argument("--auth-token", default=env_or("PAGEDSERVE_AUTH_TOKEN", ""),
                        help=f"{token_help} (env PAGEDSERVE_AUTH_TOKEN)")
    parser.add_argument("--tls-cert", default=env_or(f"{prefix}_TLS_CERT", ""),
                        help="PEM certificate chain; serves TLS together with --tls-key "
                             f"(env {prefix}_TLS_CERT)")
    parser.add_argument("--tls-key", default=env_or(f"{prefix}_TLS_KEY", ""),
                        help=f"PEM private key for --tls-cert (env {prefix}_TLS_KEY)")
    if worker_threads:
        parser.add_argument("--max-workers", type=int,
                            default=env_or(f"{prefix}_MAX_WORKERS", 16),
                            help=f"threads serving RPCs (env {prefix}_MAX_WORKERS)")
    parser.add_argument("--log-level", default=env_or(f"{prefix}_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help=f"log verbosity (env {prefix}_LOG_LEVEL)")


def server_options(args: argparse.Namespace) -> ServerOptions:
    max_workers = getattr(args, "max_workers", ServerOptions().max_workers)
    if max_workers < 1:
        raise SystemExit("--max-workers must be at least 1")
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"--port must be between 0 (pick a free one) and 65535, got {args.port}")
    return ServerOptions(host=args.host, port=args.port, auth_token=args.auth_token,
                         tls_cert=args.tls_cert, tls_key=args.tls_key,
                         max_workers=max_workers)


def redacted(url: str) -> str:
    """The URL without its password, for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))
