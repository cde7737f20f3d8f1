"""`python -m allocator_service`: serve the Allocator and AllocatorAdmin APIs."""
from __future__ import annotations

import gc
import logging
import sys
import threading
from collections.abc import Sequence

from allocator_service.core.allocator import Allocator
from allocator_service.core.compiled_build import core_description
from allocator_service.durability.state import AllocatorState
from allocator_service.durability.state_store import MemoryStore, StateStore, StoreUnreachable
from allocator_service.server.admin_servicer import AllocatorAdminServicer
from allocator_service.server.allocator_servicer import AllocatorServicer
from allocator_service.server.config import AllocatorConfig, StateStoreOptions, parse_config
from allocator_service.server.executor_identity import ExecutorIdentityInterceptor
from allocator_service.server.heap import CollectionSchedule, freeze_long_lived
from allocator_service.server.step_channel import StepChannel
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.auth import BearerTokenInterceptor
from pagedserve.common.logs import setup_logging
from pagedserve.common.server import GrpcService

SERVICE_NAMES = [pb.DESCRIPTOR.services_by_name[name].full_name
                 for name in ("Allocator", "AllocatorAdmin")]
# Seconds between attempts to reach Redis while loading the state at start.
LOAD_RETRY_S = 1.0


def build_store(options: StateStoreOptions) -> StateStore:
    if not options.url:
        return MemoryStore(options.events_max)
    from allocator_service.durability.redis_store import \
        RedisStore  # only a durable allocator needs redis
    return RedisStore(options.url, options.namespace, options.snapshot_every,
                      options.events_max, options.timeout_s)


def reap_expired_leases(state: AllocatorState, stop: threading.Event,
                        log: logging.Logger) -> None:
    """Reclaims pools whose executors stopped calling; their KV memory is gone with them."""
    interval = min(1.0, state.core.lease_ttl_s / 4)
    while not stop.wait(interval):
        for executor_id in state.reclaim_expired():
            log.warning("lease of executor %r lapsed; its pool was reclaimed", executor_id)


def load_state(state: AllocatorState, stop: threading.Event, log: logging.Logger) -> bool:
    """Loads the stored state, retrying while the store is unreachable; False if stopped."""
    attempt = 0
    while True:
        try:
            state.store.load(state.core)
            return True
        except StoreUnreachable as error:
            # It may have broken off halfway through the journal: start again from nothing.
            state.core = state.core.empty_like()
            attempt += 1
            if attempt == 1 or attempt % 30 == 0:
                log.warning("cannot load state from %s yet (%s); retrying",
                            state.store.description, error)
        if stop.wait(LOAD_RETRY_S):
            return False


def build_service(config: AllocatorConfig
                  ) -> tuple[GrpcService, AllocatorState, StepChannel | None]:
    core = Allocator(lease_ttl_s=config.lease_ttl_s, step_log_size=config.step_log_size)
    state = AllocatorState(core, build_store(config.state))
    auth: BearerTokenInterceptor | None = None
    if config.executor_tokens is not None:
        auth = ExecutorIdentityInterceptor(config.server.auth_token, config.executor_tokens)
    elif config.server.auth_token:
        auth = BearerTokenInterceptor([config.server.auth_token])
    # Bound before the servicer is made: every registration names its port.
    channel = None
    if config.step_port >= 0:
        channel = StepChannel(state, config.server, config.step_port, auth)

    def add_servicers(server):  # type: ignore[no-untyped-def]
        pb_grpc.add_AllocatorServicer_to_server(
            AllocatorServicer(state, channel.port if channel else 0), server)
        pb_grpc.add_AllocatorAdminServicer_to_server(AllocatorAdminServicer(state), server)

    service = GrpcService(config.server, SERVICE_NAMES, add_servicers, auth)
    state.on_availability = service.set_serving
    return service, state, channel


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    log = setup_logging("allocator", config.log_level)
    service, state, channel = build_service(config)
    stop = threading.Event()
    service.start()
    if channel is not None:
        channel.start()
    # One machine-readable line on stdout: tests and `pagedserve up` read the bound port here.
    # Health stays NOT_SERVING (and every call UNAVAILABLE) until the state is loaded.
    print(f"allocator listening on {config.server.host}:{service.port}", flush=True)
    failed = threading.Event()

    def load_then_serve() -> None:
        try:
            serve(state, service, stop, log)
        except Exception:  # noqa: BLE001 - a state that cannot be loaded must not be served
            log.exception("cannot load the stored state from %s; stopping",
                          state.store.description)
            failed.set()
            service.request_stop()

    threading.Thread(target=load_then_serve, name="state-loader", daemon=True).start()
    log.info("lease ttl %.1fs, auth %s, state in %s", config.lease_ttl_s,
             auth_description(config), state.store.description)
    # The compiled core serves about 1.4 times the executors per core (architecture.md).
    log.info("core: %s", core_description())
    if channel is not None:
        log.info("Step channel on %s:%d%s", config.server.host, channel.port,
                 " (TLS)" if channel.tls else "")
    else:
        log.info("no Step channel (--step-port -1): Steps go over gRPC")

    def stop_channel() -> None:
        # With the gRPC server: no new Step over either transport from here on.
        if channel is not None:
            channel.stop()

    def shut_down() -> None:
        stop.set()
        state.store.close()

    service.run_until_signal(on_shutdown=shut_down, on_stop_requested=stop_channel)
    return 1 if failed.is_set() else 0


def auth_description(config: AllocatorConfig) -> str:
    if config.executor_tokens is not None:
        return (f"shared token + own tokens of executors "
                f"{', '.join(config.executor_tokens.executor_ids)}")
    return "on" if config.server.auth_token else "off"


def serve(state: AllocatorState, service: GrpcService, stop: threading.Event,
          log: logging.Logger) -> None:
    """Loads the state, then starts the lease reaper and the store's watchdog and serves."""
    if not load_state(state, stop, log):
        return
    gc.collect()  # what failed loads left behind, before the loaded pools are frozen
    freeze_long_lived()
    CollectionSchedule().start()  # for the process's life
    threading.Thread(target=reap_expired_leases, args=(state, stop, log), name="lease-reaper",
                     daemon=True).start()
    threading.Thread(target=state.watch_store, args=(stop,), name="store-watchdog",
                     daemon=True).start()
    service.set_serving(True)
    log.info("serving")


if __name__ == "__main__":
    sys.exit(main())
