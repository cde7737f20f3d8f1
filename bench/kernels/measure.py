"""How the kernels benchmark measures: the copy bandwidth, then every decode and prefill
combination, paged Triton kernel against SDPA on the same data laid out contiguously.

Imports triton and the kernels, so bench.kernels imports this module only after it has
decided whether Triton compiles or interprets (fixed when a kernel is defined).
"""
from __future__ import annotations

import functools
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.kernels.config import SPARE_BLOCKS, Shapes, tolerance
from bench.kernels.report import DecodeResult, PrefillResult, Results
from kernels.kv_cache import KvCacheSpec, allocate_kv_cache, layer_caches
from kernels.triton.decode_attention import paged_decode_attention_triton
from kernels.triton.prefill_attention import paged_prefill_attention_triton

# SDPA's fused backends, each tried alone; the math backend only when none takes the shapes
# (it materialises the scores and, for GQA, repeats K/V per query head: no fair baseline).
FUSED_SDPA = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
              ("efficient", SDPBackend.EFFICIENT_ATTENTION))
MATH_SDPA = ("math", SDPBackend.MATH)


def time_us(fn: Callable[[], object], shapes: Shapes, device: torch.device) -> float:
    """Median time of one call. On a GPU the calls are replayed from a CUDA graph, so what is
    timed is the GPU's work and not Python's launch overhead (which would dominate a small
    decode batch for both contenders, and which a serving loop with CUDA graphs does not pay);
    a call that cannot be captured falls back to do_bench, which flushes L2 before each call.
    On the CPU the caller has run `fn` once already (the correctness check), which is when the
    interpreter's one-off work happens."""
    if device.type == "cuda":
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=shapes.rep_ms,
                                                     return_mode="median") * 1e3
        except RuntimeError:
            torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=shapes.warmup_ms, rep=shapes.rep_ms,
                                       return_mode="median") * 1e3
    samples = []
    for _ in range(shapes.cpu_reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def fastest_sdpa(sdpa: Callable[[], torch.Tensor], shapes: Shapes, device: torch.device
                 ) -> tuple[float, str, torch.Tensor]:
    """(time in µs, backend, output) of the fastest SDPA backend that takes these inputs, so
    the paged kernel is held to the best PyTorch does on contiguous K/V: at least as fast as
    whatever SDPA's own dispatch would have picked."""
    best: tuple[float, str, torch.Tensor] | None = None
    for name, backend in (*FUSED_SDPA, MATH_SDPA):
        if best is not None and backend == SDPBackend.MATH:
            break
        with sdpa_kernel(backend):
            try:
                # A backend that cannot take the shapes warns why, then raises.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    output = sdpa()
            except RuntimeError:
                continue
            # The backend is chosen around the timed calls, not inside them, so switching it
            # costs the timed call nothing.
            us = time_us(sdpa, shapes, device)
        if best is None or us < best[0]:
            best = (us, name, output)
        del output
    if best is None:
        raise RuntimeError("no SDPA backend takes these shapes")
    return best


def copy_bandwidth_gbs(shapes: Shapes, dtype: torch.dtype, device: torch.device) -> float:
    """What the machine's memory sustains for a plain stream: the ceiling decode is judged by."""
    source = torch.randn(shapes.copy_bytes // dtype.itemsize, dtype=dtype, device=device)
    target = torch.empty_like(source)
    copy = functools.partial(target.copy_, source)
    copy()
    seconds = time_us(copy, shapes, device) * 1e-6
    return 2 * source.nbytes / seconds / 1e9


def paged_copy(key: torch.Tensor, value: torch.Tensor, block_size: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same K/V (`[batch, kv heads, context, head dim]`) in a one-layer paged cache, each
    sequence's blocks scattered over the cache in random order. Returns (key_cache,
    value_cache, block_tables)."""
    batch, num_kv_heads, context, head_dim = key.shape
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq + SPARE_BLOCKS
    spec = KvCacheSpec(num_layers=1, num_blocks=num_blocks, block_size=block_size,
                       num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=key.dtype)
    kv_cache = allocate_kv_cache(spec, key.device)
    # Spare blocks and the unused tail of each sequence's last block hold random values too,
    # so a kernel that reads past a context would show up in the comparison with SDPA.
    kv_cache.normal_()
    key_cache, value_cache = layer_caches(kv_cache, 0)
    order = torch.randperm(num_blocks, device=key.device)[:batch * blocks_per_seq]
    for contiguous, cache in ((key, key_cache), (value, value_cache)):
        # One of K, V at a time: the token-major copy is as large as the source.
        token_major = cache.new_empty(batch, blocks_per_seq * block_size, num_kv_heads,
                                      head_dim)
        token_major[:, context:].normal_()
        token_major[:, :context] = contiguous.transpose(1, 2)
        cache[order] = token_major.view(-1, block_size, num_kv_heads, head_dim)
        del token_major
    block_tables = order.view(batch, blocks_per_seq).to(torch.int32)
    return key_cache, value_cache, block_tables


def compare(result: DecodeResult | PrefillResult, got: torch.Tensor, expected: torch.Tensor,
            dtype_name: str) -> None:
    atol, rtol = tolerance(dtype_name)
    got, expected = got.float(), expected.float()
    result.max_abs_error = (got - expected).abs().max().item()
    result.close = bool(torch.allclose(got, expected, atol=atol, rtol=rtol))


def free(device: torch.device) -> None:
    """Hands cached blocks back between shapes, so one combination's leftovers never push a
    larger one over the device's memory."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_decode(r: Results, dtype: torch.dtype, device: torch.device, progress) -> None:
    s = r.shapes
    scale = s.head_dim ** -0.5
    budget = r.max_kv_gib * 1024**3
    for context in s.contexts:
        for batch in s.batches:
            kv_bytes = 2 * batch * context * s.num_kv_heads * s.head_dim * dtype.itemsize
            if kv_bytes > budget:
                r.decode += [DecodeResult(block_size, context, batch, kv_bytes, skipped=True)
                             for block_size in s.block_sizes]
                progress.update(len(s.block_sizes))
                continue
            progress.set_postfix_str(f"decode {batch} × {context}")
            query = torch.randn(batch, s.num_q_heads, s.head_dim, dtype=dtype, device=device)
            key, value = (torch.randn(batch, s.num_kv_heads, context, s.head_dim, dtype=dtype,
                                      device=device) for _ in range(2))
            sdpa = functools.partial(F.scaled_dot_product_attention, query.unsqueeze(2), key,
                                     value, scale=scale, enable_gqa=True)
            sdpa_us, backend, expected = fastest_sdpa(sdpa, s, device)
            expected = expected.squeeze(2)
            context_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
            out = torch.empty_like(query)
            for block_size in s.block_sizes:
                key_cache, value_cache, block_tables = paged_copy(key, value, block_size)
                paged = functools.partial(
                    paged_decode_attention_triton, query, key_cache, value_cache, block_tables,
                    context_lens, scale, max_context_len=context, out=out)
                result = DecodeResult(block_size, context, batch, kv_bytes, sdpa_us=sdpa_us,
                                      sdpa_backend=backend,
                                      bytes_moved=kv_bytes + 2 * query.nbytes)
                compare(result, paged(), expected, r.dtype)
                result.paged_us = time_us(paged, s, device)
                r.decode.append(result)
                del key_cache, value_cache, block_tables, paged
                progress.update(1)
            del query, key, value, sdpa, expected, out
            free(device)


def measure_prefill(r: Results, dtype: torch.dtype, device: torch.device, progress) -> None:
    s = r.shapes
    scale = s.head_dim ** -0.5
    budget = r.max_kv_gib * 1024**3
    for length in s.prefill_lengths:
        for batch in s.prefill_batches:
            kv_bytes = 2 * batch * length * s.num_kv_heads * s.head_dim * dtype.itemsize
            if kv_bytes > budget:
                r.prefill += [PrefillResult(block_size, batch, length, kv_bytes, skipped=True)
                              for block_size in s.prefill_block_sizes]
                progress.update(len(s.prefill_block_sizes))
                continue
            progress.set_postfix_str(f"prefill {batch} × {length}")
            query = torch.randn(batch, s.num_q_heads, length, s.head_dim, dtype=dtype,
                                device=device)
            key, value = (torch.randn(batch, s.num_kv_heads, length, s.head_dim, dtype=dtype,
                                      device=device) for _ in range(2))
            sdpa = functools.partial(F.scaled_dot_product_attention, query, key, value,
                                     scale=scale, is_causal=True, enable_gqa=True)
            # The paged kernels take the batch flattened to tokens, heads inside a token.
            sdpa_us, backend, expected = fastest_sdpa(sdpa, s, device)
            expected = expected.transpose(1, 2).reshape(batch * length, s.num_q_heads,
                                                        s.head_dim)
            flat_query = query.transpose(1, 2).reshape(batch * length, s.num_q_heads,
                                                       s.head_dim).contiguous()
            query_start_loc = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32,
                                           device=device)
            seq_lens = torch.full((batch,), length, dtype=torch.int32, device=device)
            out = torch.empty_like(flat_query)
            flops = 2 * 2 * batch * s.num_q_heads * length * length / 2 * s.head_dim
            for block_size in s.prefill_block_sizes:
                key_cache, value_cache, block_tables = paged_copy(key, value, block_size)
                paged = functools.partial(
                    paged_prefill_attention_triton, flat_query, key_cache, value_cache,
                    block_tables, query_start_loc, seq_lens, scale, max_query_len=length,
                    max_seq_len=length, out=out)
                result = PrefillResult(block_size, batch, length, kv_bytes, sdpa_us=sdpa_us,
                                       sdpa_backend=backend, flops=flops)
                compare(result, paged(), expected, r.dtype)
                result.paged_us = time_us(paged, s, device)
                r.prefill.append(result)
                del key_cache, value_cache, block_tables, paged
                progress.update(1)
            del query, key, value, sdpa, expected, flat_query, out
            free(device)
