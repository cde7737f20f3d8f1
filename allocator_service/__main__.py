"""`python -m allocator_service`: serve the Allocator and AllocatorAdmin APIs."""
from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence

from allocator_service.admin_servicer import AllocatorAdminServicer
from allocator_service.allocator import Allocator
from allocator_service.allocator_servicer import AllocatorServicer
from allocator_service.config import AllocatorConfig, parse_config
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.logs import setup_logging
from pagedserve.common.server import GrpcService

SERVICE_NAMES = [pb.DESCRIPTOR.services_by_name[name].full_name
                 for name in ("Allocator", "AllocatorAdmin")]


def reap_expired_leases(core: Allocator, lock: threading.Lock, stop: threading.Event,
                        log: logging.Logger) -> None:
    """Reclaims pools whose executors stopped calling; their KV memory is gone with them."""
    interval = min(1.0, core.lease_ttl_s / 4)
    while not stop.wait(interval):
        with lock:
            expired = core.expire_leases()
        for executor_id in expired:
            log.warning("lease of executor %r lapsed; its pool was reclaimed", executor_id)


def build_service(config: AllocatorConfig) -> tuple[GrpcService, Allocator, threading.Lock]:
    core = Allocator(lease_ttl_s=config.lease_ttl_s, step_log_size=config.step_log_size)
    lock = threading.Lock()  # the single owner of the core's state

    def add_servicers(server):  # type: ignore[no-untyped-def]
        pb_grpc.add_AllocatorServicer_to_server(AllocatorServicer(core, lock), server)
        pb_grpc.add_AllocatorAdminServicer_to_server(AllocatorAdminServicer(core, lock), server)

    return GrpcService(config.server, SERVICE_NAMES, add_servicers), core, lock


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_config(argv)
    log = setup_logging("allocator", config.log_level)
    service, core, lock = build_service(config)
    stop_reaper = threading.Event()
    reaper = threading.Thread(target=reap_expired_leases, args=(core, lock, stop_reaper, log),
                              name="lease-reaper", daemon=True)
    service.start()
    reaper.start()
    service.set_serving(True)
    # One machine-readable line on stdout: tests and `pagedserve up` read the bound port here.
    print(f"allocator listening on {config.server.host}:{service.port}", flush=True)
    log.info("serving (lease ttl %.1fs, auth %s)", config.lease_ttl_s,
             "on" if config.server.auth_token else "off")
    service.run_until_signal(on_shutdown=stop_reaper.set)


if __name__ == "__main__":
    sys.exit(main())
