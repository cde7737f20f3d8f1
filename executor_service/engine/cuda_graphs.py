"""CUDA graphs of the decode forward pass: captured at start-up, replayed for pure decodes.

Eager, a forward pass launches about 50 kernels per layer, each behind Python and torch's
dispatch; for a small model at decode the GPU waits on the host. A graph records the launches
of one whole pass once, at start-up, and replays them with one call. What makes that possible:

- The inputs live in device buffers allocated once (step_inputs.py, mirrored_buffer.py); a graph
  is captured on views of them, and each iteration uploads into the same addresses.
- Nothing in the launches depends on the batch's contents: the decode kernel's grid and
  constexprs follow from the batch size and the model alone (kernels/triton/decode_attention.py),
  and the block tables are captured at their full width.
- Batch sizes are bucketed (BUCKETS): a decode of n rows replays the smallest graph of at least
  n rows, padded with rows of an empty context that the kernels skip.

Prefill and mixed batches run eagerly (their shapes vary too much to capture), and so does a
decode above the largest bucket. `--enforce-eager` captures nothing. The graphs share one memory
pool, captured largest first so the smaller ones reuse its blocks.
"""
from __future__ import annotations

import logging
import time

import torch

from executor_service.engine.step_inputs import StepInputs
from executor_service.model.causal_lm import CausalLM

log = logging.getLogger(__name__)

# Batch sizes captured: 1, 2, 4, then every multiple of 8, up to max_num_seqs (also captured).
SMALL_BUCKETS = (1, 2, 4)
BUCKET_STEP = 8


def decode_buckets(max_num_seqs: int) -> list[int]:
    """The batch sizes a graph is captured for, ascending; the last is max_num_seqs."""
    sizes = [size for size in SMALL_BUCKETS if size < max_num_seqs]
    sizes += range(BUCKET_STEP, max_num_seqs, BUCKET_STEP)
    return sorted(set(sizes) | {max_num_seqs})


def bucket_for(buckets: list[int], num_rows: int) -> int | None:
    """The smallest bucket holding num_rows rows; None when none does."""
    for size in buckets:
        if size >= num_rows:
            return size
    return None


class DecodeGraphs:
    """The captured graphs, by batch size, and their outputs (hidden states of every row)."""

    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, inputs: StepInputs,
                 max_num_seqs: int) -> None:
        if not kv_cache.is_cuda:
            raise ValueError("CUDA graphs need the KV cache on a CUDA device")
        self.model, self.kv_cache, self.inputs = model, kv_cache, inputs
        self.buckets = decode_buckets(max_num_seqs)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._generation: int | None = None

    def capture(self) -> float:
        """Captures a graph per bucket; returns the seconds taken."""
        started = time.monotonic()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.kv_cache.device)
        with torch.inference_mode():
            for size in reversed(self.buckets):
                token_ids, positions, batch = self.inputs.graph_inputs(size)
                # One eager pass first, on a side stream as capture requires: it compiles
                # what is not compiled yet, so nothing compiles inside the capture.
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    self.model(token_ids, positions, self.kv_cache, batch)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._outputs[size] = self.model(token_ids, positions, self.kv_cache, batch)
                self._graphs[size] = graph
        torch.cuda.synchronize(self.kv_cache.device)
        self._generation = self.inputs.generation
        seconds = time.monotonic() - started
        log.info("captured %d CUDA graphs of the decode pass (batch sizes %d..%d) in %.1f s",
                 len(self._graphs), self.buckets[0], self.buckets[-1], seconds)
        return seconds

    def bucket(self, num_decode: int, num_prefill: int) -> int | None:
        """The graph size to pad this iteration to, or None to run it eagerly."""
        if num_prefill or not num_decode or not self._graphs:
            return None
        if self.inputs.generation != self._generation:
            # The inputs outgrew the buffers the graphs read (the scheduler exceeded the sizes
            # it was built with): they can never replay again.
            log.warning("the forward pass's input buffers were reallocated; decode runs "
                        "eagerly from now on")
            self._graphs.clear()
            return None
        return bucket_for(self.buckets, num_decode)

    def replay(self, size: int) -> torch.Tensor:
        """Runs the graph of `size` rows over what the buffers hold; its hidden states."""
        self._graphs[size].replay()
        return self._outputs[size]
