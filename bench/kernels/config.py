"""What the kernels benchmark sweeps, and the targets it judges: the full GPU sweep over
Llama-3-8B attention shapes, and the tiny --quick shapes the Triton interpreter can get through
in seconds."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

TARGET_BANDWIDTH_FRACTION = 0.8    # decode at the target point, of the measured copy bandwidth
TARGET_RATIO = 1.1                 # paged / SDPA time, decode, at every block size swept
TARGET_BLOCK_SIZE = 16             # the smallest block: the most scattered gather
# Blocks beyond what the sequences use, so the shuffled block tables do not cover the whole
# cache and the kernel never sees a table that is just a permutation of every block.
SPARE_BLOCKS = 7


@dataclass(frozen=True, slots=True)
class Shapes:
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_sizes: tuple[int, ...]
    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    prefill_block_sizes: tuple[int, ...]
    prefill_batches: tuple[int, ...]
    prefill_lengths: tuple[int, ...]
    # The buffer dst.copy_(src) copies to measure the machine's bandwidth.
    copy_bytes: int
    # The decode point the bandwidth target is judged at.
    target_batch: int
    target_context: int
    # What the doc calls these shapes.
    label: str = "Llama-3-8B attention shapes"
    # triton.testing's timing budgets on a GPU (ms); timed calls per measurement on the CPU.
    warmup_ms: int = 25
    rep_ms: int = 100
    cpu_reps: int = 1

    @property
    def decode_combos(self) -> int:
        return len(self.block_sizes) * len(self.contexts) * len(self.batches)

    @property
    def prefill_combos(self) -> int:
        return len(self.prefill_block_sizes) * len(self.prefill_batches) * \
            len(self.prefill_lengths)


FULL = Shapes(
    num_q_heads=32, num_kv_heads=8, head_dim=128,
    block_sizes=(16, 32, 64, 128, 256),
    contexts=(512, 1024, 2048, 4096, 8192, 16384),
    batches=(1, 4, 16, 64, 256),
    prefill_block_sizes=(16, 128),
    prefill_batches=(1, 4, 16),
    prefill_lengths=(512, 2048, 8192),
    # Far beyond any L2 (50 MiB on an H100/H200), so the copy streams from and to HBM.
    copy_bytes=2 * 1024**3,
    target_batch=64, target_context=4096,
)

# The full run's target points alone (decode at batch 64 x 4k at every block size, one prefill):
# what `--targets` measures in about a minute, for a GPU check with no time for the sweep.
TARGETS = dataclasses.replace(
    FULL, contexts=(FULL.target_context,), batches=(FULL.target_batch,),
    prefill_block_sizes=(TARGET_BLOCK_SIZE,), prefill_batches=(1,), prefill_lengths=(2048,),
    label="Llama-3-8B attention shapes, target points only")

# Every code path of the full run, at sizes the interpreter finishes quickly. 320 tokens fill
# five decode segments of one tile each, merged; 200 and 80 leave the last block part-filled, so
# the masking of a block's tail is checked against SDPA.
QUICK = Shapes(
    num_q_heads=4, num_kv_heads=2, head_dim=32,
    block_sizes=(16, 64, 256),
    contexts=(200, 320),
    batches=(1, 2),
    prefill_block_sizes=(16, 64),
    prefill_batches=(2,),
    prefill_lengths=(80,),
    copy_bytes=16 * 1024**2,
    target_batch=2, target_context=320,
    label="tiny smoke-run shapes", warmup_ms=5, rep_ms=20, cpu_reps=1,
)


def tolerance(dtype_name: str) -> tuple[float, float]:
    """(atol, rtol) between a paged output and SDPA's on the same K/V: both round the same fp32
    result to the output dtype, so they differ by a few of its ulps at most."""
    return (2e-2, 2e-2) if dtype_name in ("bfloat16", "float16") else (1e-4, 1e-4)
