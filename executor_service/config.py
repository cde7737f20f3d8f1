"""The executor's configuration, from flags and PAGEDSERVE_EXECUTOR_* environment variables."""
from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from executor_service.engine.build import DEFAULT_GPU_MEMORY_UTILIZATION, EngineOptions
from executor_service.model.compiled_forward import COMPILE_CHOICES
from pagedserve.common.allocator_shards import parse_allocator_group
from pagedserve.common.config import add_server_flags, env_or, server_options
from pagedserve.common.server import ServerOptions
from pagedserve.protocol.sampling_params import MAX_N

DEFAULT_PORT = 50053
ENV_PREFIX = "PAGEDSERVE_EXECUTOR"
SIZE_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


@dataclass(slots=True, frozen=True)
class ExecutorConfig:
    server: ServerOptions
    # The allocator, or every shard of an allocator group; the pool registers with one of them.
    allocator_group: tuple[str, ...]
    allocator_token: str
    # PEM CA bundle that verifies a TLS allocator; empty: the allocator channel is plaintext.
    allocator_tls_ca: str
    executor_id: str
    # The executor's place in a numbered fleet, which picks its shard evenly; None: the id does
    # (pagedserve/common/allocator_shards.py).
    executor_index: int | None
    advertise_address: str
    model: Path | None            # None: the embedded default
    # What clients call the model; empty: the checkpoint directory's name.
    served_model_name: str
    engine: EngineOptions
    log_level: str
    # torch's intra-op threads for the model; 0 leaves torch's default (one per core).
    torch_threads: int = 0


def parse_size(text: str) -> int:
    """Bytes from `512M`, `2G`, `2GiB` or a plain number."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)(?:i?[bB])?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).lower()])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m executor_service",
        description="pagedserve executor: runs a model on KV-cache blocks the allocator grants")
    add_server_flags(parser, ENV_PREFIX, DEFAULT_PORT)
    env = lambda name, default: env_or(f"{ENV_PREFIX}_{name}", default)  # noqa: E731
    parser.add_argument("--allocator", default=env("ALLOCATOR", "127.0.0.1:50052"),
                        help="the allocator's HOST:PORT, or HOST:PORT,HOST:PORT,... for an "
                             "allocator group: the pool registers with the shard its executor "
                             "id hashes to, so list the shards alike everywhere "
                             f"(env {ENV_PREFIX}_ALLOCATOR)")
    parser.add_argument("--allocator-token", default=env("ALLOCATOR_TOKEN", ""),
                        help="bearer token for the allocator (default: --auth-token, the "
                             f"services' shared token) (env {ENV_PREFIX}_ALLOCATOR_TOKEN)")
    parser.add_argument("--tls-ca", default=env("TLS_CA", ""),
                        help="PEM CA bundle to verify the allocator's TLS; without it the "
                             f"allocator is reached in plaintext (env {ENV_PREFIX}_TLS_CA)")
    parser.add_argument("--executor-id", default=env("ID", ""),
                        help="id to register under (default: HOSTNAME-PORT) "
                             f"(env {ENV_PREFIX}_ID)")
    parser.add_argument("--executor-index", type=int, default=env("INDEX", -1),
                        help="this executor's number in a fleet numbered 0, 1, 2, ...: in an "
                             "allocator group it picks the shard, keeping the shards even; "
                             "the allocator refuses a number another executor holds "
                             "(-1, the default: none, the executor id picks the shard) "
                             f"(env {ENV_PREFIX}_INDEX)")
    parser.add_argument("--advertise-address", default=env("ADVERTISE_ADDRESS", ""),
                        help="HOST:PORT the gateway reaches this executor at "
                             "(default: --host:bound port) "
                             f"(env {ENV_PREFIX}_ADVERTISE_ADDRESS)")
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=env("MODEL", ""),
                       help="Hugging Face checkpoint directory; omitted: the embedded default "
                            f"(env {ENV_PREFIX}_MODEL)")
    model.add_argument("--served-model-name", default=env("SERVED_MODEL_NAME", ""),
                       help="the name clients ask for (default: the checkpoint directory's "
                            f"name) (env {ENV_PREFIX}_SERVED_MODEL_NAME)")
    model.add_argument("--device", default=env("DEVICE", "cpu"),
                       help=f"cpu, cuda or cuda:N (env {ENV_PREFIX}_DEVICE)")
    model.add_argument("--torch-threads", type=int, default=env("TORCH_THREADS", 0),
                       help="torch threads for the model's math; 0: torch's default, one per "
                            "core (on a machine the gateway and allocator share, fewer leaves "
                            f"them a core) (env {ENV_PREFIX}_TORCH_THREADS)")
    model.add_argument("--dtype", default=env("DTYPE", "auto"),
                       choices=["auto", "float32", "bfloat16", "float16"],
                       help="weights' dtype; auto: the checkpoint's on a GPU, float32 on the CPU "
                            f"(env {ENV_PREFIX}_DTYPE)")
    model.add_argument("--compile", default=env("COMPILE", "auto"), choices=COMPILE_CHOICES,
                       help="torch.compile the forward pass's tensor math (inductor), warmed "
                            "up before serving; auto: on CUDA only (on the CPU the eager pass "
                            "measured faster); off: eager, like vLLM's --enforce-eager "
                            f"(env {ENV_PREFIX}_COMPILE)")
    model.add_argument("--enforce-eager", action="store_true",
                       default=env("ENFORCE_EAGER", "").lower() in ("1", "true", "yes", "on"),
                       help="run every forward pass eagerly: on CUDA, capture no CUDA graphs "
                            "of the decode pass (they are captured at start-up for batch sizes "
                            "up to --max-num-seqs and replayed for pure decodes); the variable "
                            f"turns it on with 1, true, yes or on (env {ENV_PREFIX}_ENFORCE_EAGER)")
    model.add_argument("--max-model-len", type=int, default=env("MAX_MODEL_LEN", 0),
                       help="longest context served (default: the model's, lowered to what "
                            "the KV cache holds for one sequence) "
                            f"(env {ENV_PREFIX}_MAX_MODEL_LEN)")
    cache = parser.add_argument_group("KV cache and batching")
    cache.add_argument("--block-size", type=int, default=env("BLOCK_SIZE", 16),
                       choices=[16, 32, 64, 128, 256],
                       help=f"tokens per KV-cache block (env {ENV_PREFIX}_BLOCK_SIZE)")
    cache.add_argument("--num-blocks", type=int, default=env("NUM_BLOCKS", 0),
                       help="KV-cache blocks (default: from --kv-cache-memory) "
                            f"(env {ENV_PREFIX}_NUM_BLOCKS)")
    cache.add_argument("--kv-cache-memory", type=parse_size,
                       default=env("KV_CACHE_MEMORY", None),
                       help="memory for the KV cache when --num-blocks is not given (default: "
                            "256M on the CPU, from --gpu-memory-utilization on CUDA) "
                            f"(env {ENV_PREFIX}_KV_CACHE_MEMORY)")
    cache.add_argument("--gpu-memory-utilization", type=float,
                       default=env("GPU_MEMORY_UTILIZATION", None),
                       help="share of the GPU's memory this executor may use, the KV cache "
                            "taking what the weights and the largest forward pass (measured "
                            "at start) leave; CUDA only (default 0.9 when neither --num-blocks "
                            "nor --kv-cache-memory is given) "
                            f"(env {ENV_PREFIX}_GPU_MEMORY_UTILIZATION)")
    cache.add_argument("--max-num-seqs", type=int, default=env("MAX_NUM_SEQS", 256),
                       help=f"sequences running at once at most (env {ENV_PREFIX}_MAX_NUM_SEQS)")
    cache.add_argument("--max-num-batched-tokens", type=int,
                       default=env("MAX_NUM_BATCHED_TOKENS", 2048),
                       help="token budget of one iteration (prefill chunks + decodes) "
                            f"(env {ENV_PREFIX}_MAX_NUM_BATCHED_TOKENS)")
    cache.add_argument("--lookahead-slots", type=int, default=env("LOOKAHEAD_SLOTS", 4),
                       help="slots reserved ahead of each decoding sequence "
                            f"(env {ENV_PREFIX}_LOOKAHEAD_SLOTS)")
    cache.add_argument("--step-interval", type=int, default=env("STEP_INTERVAL", 1),
                       help="iterations an allocator Step may be put off while nothing needs "
                            "its answer; waiting requests are admitted when one is due. Above 1 "
                            "a fleet's allocator does several times less work per executor "
                            "(docs/architecture.md) "
                            f"(env {ENV_PREFIX}_STEP_INTERVAL)")
    cache.add_argument("--reserve-blocks", type=int, default=env("RESERVE_BLOCKS", 1),
                       help="whole blocks a decoding sequence's Append reserves ahead: 2 "
                            "halves the Appends a fleet's allocator handles, for one more block "
                            "held ahead by every running sequence "
                            f"(env {ENV_PREFIX}_RESERVE_BLOCKS)")
    cache.add_argument("--max-beam-width", type=int, default=env("MAX_BEAM_WIDTH", 16),
                       help="the widest beam search a request may ask for; each beam is a "
                            f"running sequence (env {ENV_PREFIX}_MAX_BEAM_WIDTH)")
    cache.add_argument("--seed", type=int, default=env("SEED", -1),
                       help="seed of unseeded requests' sampling (default: from the OS) "
                            f"(env {ENV_PREFIX}_SEED)")
    return parser


def parse_config(argv: Sequence[str] | None = None) -> ExecutorConfig:
    args = build_parser().parse_args(argv)
    if isinstance(args.kv_cache_memory, str):
        args.kv_cache_memory = parse_size(args.kv_cache_memory)
    for name, low in (("num_blocks", 0), ("max_model_len", 0), ("max_num_seqs", 1),
                      ("torch_threads", 0),
                      ("max_num_batched_tokens", 1), ("lookahead_slots", 0),
                      ("step_interval", 1), ("max_beam_width", 1),
                      ("reserve_blocks", 1)):
        if getattr(args, name) < low:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least {low}")
    if args.executor_index < -1:
        raise SystemExit(f"--executor-index must be 0 or more (or -1: none), not "
                         f"{args.executor_index}")
    if args.max_beam_width > MAX_N:
        # Beam sequence ids stay below 2 * width: as short as the n choices' (convert.py).
        raise SystemExit(f"--max-beam-width must be at most {MAX_N}")
    if args.gpu_memory_utilization is not None:
        args.gpu_memory_utilization = float(args.gpu_memory_utilization)
        if not 0 < args.gpu_memory_utilization <= 1:
            raise SystemExit("--gpu-memory-utilization must be in (0, 1], got "
                             f"{args.gpu_memory_utilization:g}")
        if not args.device.startswith("cuda"):
            raise SystemExit("--gpu-memory-utilization sizes the KV cache from a GPU's memory; "
                             f"on --device {args.device} give --kv-cache-memory or --num-blocks")
    try:
        allocator_group = parse_allocator_group(args.allocator)
    except ValueError as error:
        raise SystemExit(f"--allocator: {error}") from None
    if args.model and not Path(args.model).is_dir():
        raise SystemExit(f"--model {args.model}: no such directory")
    server = server_options(args)
    engine = EngineOptions(
        device=args.device, dtype=args.dtype, block_size=args.block_size,
        num_blocks=args.num_blocks or None, kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=(DEFAULT_GPU_MEMORY_UTILIZATION
                                if args.gpu_memory_utilization is None
                                else args.gpu_memory_utilization),
        max_model_len=args.max_model_len or None, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        lookahead_slots=args.lookahead_slots, step_interval=args.step_interval,
        max_beam_width=args.max_beam_width, reserve_blocks=args.reserve_blocks,
        compile=args.compile, enforce_eager=args.enforce_eager,
        sampler_seed=None if args.seed < 0 else args.seed)
    return ExecutorConfig(
        server=server, allocator_group=allocator_group,
        allocator_token=args.allocator_token or args.auth_token,
        allocator_tls_ca=args.tls_ca, executor_id=args.executor_id,
        executor_index=None if args.executor_index < 0 else args.executor_index,
        advertise_address=args.advertise_address,
        model=Path(args.model) if args.model else None,
        served_model_name=args.served_model_name, engine=engine,
        log_level=args.log_level, torch_threads=args.torch_threads)


def default_executor_id(port: int) -> str:
    return f"{socket.gethostname()}-{port}"


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def default_advertise_address(host: str, port: int) -> str:
    """Where the gateway reaches this executor when --advertise-address is not given: the
    listening host, or, when that is every interface (a container), this machine's own address
    as its hostname resolves (in a compose network, the container's IP)."""
    if host not in WILDCARD_HOSTS:
        return f"{host}:{port}"
    try:
        return f"{socket.gethostbyname(socket.gethostname())}:{port}"
    except OSError:
        return f"127.0.0.1:{port}"
