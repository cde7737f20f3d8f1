"""`pagedserve health HOST:PORT`: exit 0 when the service there reports gRPC health SERVING,
1 otherwise. Container health checks call it (docker-compose.yml); it needs no token, because
every pagedserve service leaves the health protocol open."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.common.client import open_channel


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedserve health", description=__doc__.split("\n")[0])
    parser.add_argument("target", help="HOST:PORT of an allocator, executor or gateway")
    parser.add_argument("--service", default="",
                        help="a service name to ask about; empty: the server as a whole")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="seconds to wait")
    parser.add_argument("--tls-ca", default="", help="PEM CA bundle for a TLS service")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with open_channel(args.target, tls_ca=args.tls_ca) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_s)
        except grpc.RpcError as error:
            print(f"{args.target}: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.target}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
