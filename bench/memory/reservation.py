"""The schemes pagedserve is compared with: each request reserves its KV memory up front, in one
contiguous piece, for as many tokens as it might ever hold. Simulated, not served: what they
cost in memory follows from their sizes alone.

    contiguous   the maximum model length for every request: a server that cannot know how
                 long an answer will be (the vLLM paper's "Orca (Max)")
    pow2         the next power of two at or above prompt + output length: a server that knows
                 the final length to within 2× ("Orca (Pow2)")

The replay keeps the engine's iteration structure (executor_service/engine/scheduler.py), so the
schemes differ only in what they reserve: each iteration, every running request computes one
token (or, until its prompt is done, a chunk of its prompt, out of a shared budget of
`max_batched_tokens`); then waiting requests are admitted oldest first, each computing a first
prompt chunk in the iteration that admits it, while the token budget lasts and the next
request's reservation fits in what is not reserved. Requests that sampled their last token give
their reservation back before the next iteration. A reservation is never outgrown, so nothing is
ever preempted.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.memory.samples import Sample, SchemeRun

# (prompt length, output length) -> token slots reserved for the request.
Reserve = Callable[[int, int], int]


def max_length_reservation(max_model_len: int) -> Reserve:
    return lambda prompt_len, output_len: max_model_len


def power_of_two_reservation(prompt_len: int, output_len: int) -> int:
    return 1 << (prompt_len + output_len - 1).bit_length()


@dataclass(slots=True)
class _Running:
    index: int
    reserved: int
    prompt_left: int     # prompt tokens not computed yet
    tokens: int          # tokens held: the whole prompt from admission, then one per decode
    sampled: int = 0     # output tokens sampled so far


def replay_reservations(name: str, label: str, prompt_lens: Sequence[int],
                        output_lens: Sequence[int], reserve: Reserve, budget_slots: int,
                        max_batched_tokens: int, progress=None) -> SchemeRun:
    """Serves every request (all waiting at the start) under `reserve`; a sample per iteration."""
    sizes = [reserve(p, o) for p, o in zip(prompt_lens, output_lens)]
    if max(sizes, default=0) > budget_slots:
        raise ValueError(f"a request reserves {max(sizes)} slots; the budget is {budget_slots}")
    run = SchemeRun(name, label, budget_slots)
    started = time.perf_counter()
    waiting = deque(range(len(sizes)))
    running: list[_Running] = []
    reserved = 0
    while waiting or running:
        budget = max_batched_tokens
        work: list[tuple[_Running, int]] = []
        for request in running:
            if budget == 0:
                break
            chunk = min(request.prompt_left, budget) if request.prompt_left else 1
            work.append((request, chunk))
            budget -= chunk
        while waiting and budget > 0 and reserved + sizes[waiting[0]] <= budget_slots:
            index = waiting.popleft()
            request = _Running(index, sizes[index], prompt_lens[index], prompt_lens[index])
            running.append(request)
            reserved += request.reserved
            chunk = min(request.prompt_left, budget)
            work.append((request, chunk))
            budget -= chunk
        for request, chunk in work:
            if request.prompt_left:
                request.prompt_left -= chunk
                request.sampled += request.prompt_left == 0  # the prompt's last logits
            else:
                request.tokens += 1     # the token sampled last is computed...
                request.sampled += 1    # ...and the next one sampled
        run.samples.append(Sample(bool(waiting), len(running),
                                  sum(request.tokens for request in running), reserved))
        done = [r for r in running if r.sampled == output_lens[r.index]]
        for request in done:
            running.remove(request)
            reserved -= request.reserved
        run.completed += len(done)
        if progress is not None and done:
            progress.update(len(done))
    run.wall_s = time.perf_counter() - started
    return run
