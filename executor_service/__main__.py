"""`python -m executor_service`: load a model, register its KV cache with the allocator, serve
the Executor API."""
from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence

import torch

from executor_service.allocator_client import RemoteBlockAllocator
from executor_service.config import (ExecutorConfig, default_advertise_address, default_executor_id,
                                     parse_config)
from executor_service.engine.build import build_engine
from executor_service.heap import settle_startup_heap
from executor_service.model.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir
from executor_service.model.model_config import ModelConfig
from executor_service.model.tokenizer_files import load_tokenizer_files
from executor_service.servicer import ExecutorServicer
from executor_service.serving_loop import ServingLoop
from pagedserve.common.allocator_shards import executor_shard
from pagedserve.common.logs import setup_logging
from pagedserve.common.server import GrpcService
from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.executor.v1 import executor_pb2_grpc as pb_grpc

SERVICE_NAMES = [pb.DESCRIPTOR.services_by_name["Executor"].full_name]


def load_and_register(config: ExecutorConfig, port: int, servicer: ExecutorServicer,
                      service: GrpcService) -> ServingLoop:
    executor_id = config.executor_id or default_executor_id(port)
    address = config.advertise_address or default_advertise_address(config.server.host, port)
    directory = config.model or embedded_model_dir()
    model_config = ModelConfig.from_dir(directory, max_model_len=config.engine.max_model_len)
    tokenizer = load_tokenizer_files(directory, model_config.vocab_size)
    # In an allocator group, the shard its index (or else its id) hashes to owns its pool.
    shard = executor_shard(executor_id, config.executor_index, config.allocator_group)
    if len(config.allocator_group) > 1:
        logging.getLogger(__name__).info(
            "registering with allocator %s, shard %d of %d (placed by %s)", shard,
            config.allocator_group.index(shard) + 1, len(config.allocator_group),
            f"executor index {config.executor_index}" if config.executor_index is not None
            else f"executor id {executor_id!r}")
    allocator = RemoteBlockAllocator(shard, executor_id, address,
                                     token=config.allocator_token,
                                     tls_ca=config.allocator_tls_ca,
                                     executor_index=config.executor_index)
    engine = build_engine(directory, config.engine, allocator)
    loop = ServingLoop(engine)
    model = engine.runner.model.config
    info = pb.ExecutorInfo(
        executor_id=executor_id,
        model_name=config.served_model_name or (
            EMBEDDED_MODEL_NAME if config.model is None else directory.name),
        model_fingerprint=engine.model_fingerprint, vocab_size=model.vocab_size,
        max_model_len=engine.max_model_len, eos_token_ids=sorted(engine.eos_token_ids),
        block_size=config.engine.block_size, num_blocks=engine.num_blocks,
        dtype=str(engine.runner.kv_cache.dtype).removeprefix("torch."),
        device=str(engine.runner.device), tokenizer_digest=tokenizer.digest)
    servicer.ready(loop, info, tokenizer)
    settle_startup_heap()  # the model, the engine and every module: alive until the end
    loop.start()
    service.set_serving(True)
    return loop


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    log = setup_logging("executor", config.log_level)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    servicer = ExecutorServicer()
    service = GrpcService(config.server, SERVICE_NAMES,
                          lambda server: pb_grpc.add_ExecutorServicer_to_server(servicer, server))
    service.start()
    # One machine-readable line on stdout (tests and `pagedserve up` read the port here);
    # health stays NOT_SERVING until the model is loaded and the pool registered.
    print(f"executor listening on {config.server.host}:{service.port}", flush=True)
    failed = threading.Event()
    loops: list[ServingLoop] = []

    def start() -> None:
        try:
            loops.append(load_and_register(config, service.port, servicer, service))
            log.info("serving %s on %s", servicer.static_info.model_name, config.engine.device)
        except Exception:  # noqa: BLE001 - an executor that cannot load must not serve
            log.exception("cannot start the executor; stopping")
            failed.set()
            service.request_stop()

    threading.Thread(target=start, name="model-loader", daemon=True).start()

    def shut_down() -> None:
        for loop in loops:
            loop.stop()
            loop.engine.allocator.close()

    service.run_until_signal(on_shutdown=shut_down)
    return 1 if failed.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
