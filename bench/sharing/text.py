"""The prose of the `## Sharing` section: how the benchmark measured, and why its savings land
where they do next to the vLLM paper's (Kwon et al., "Efficient Memory Management for Large
Language Model Serving with PagedAttention", SOSP 2023). Paragraphs come back unwrapped;
report.py wraps them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from bench.report import drawn_lengths
from bench.sharing.workload import BLOCK_SIZE, PARALLEL, SYSTEM

from allocator_service.executor_pool import blocks_for

if TYPE_CHECKING:
    from sharing_report import Results

# The paper's §6.3 / Fig. 15: blocks saved by sharing over blocks without sharing, OPT-13B,
# n (or beam width) 2, 4, 6.
PAPER_PARALLEL = "6.1–9.8% on Alpaca and 16.2–30.5% on ShareGPT"
PAPER_PARALLEL_RANGE = (0.061, 0.305)
PAPER_BEAM = "37.6–55.2% on Alpaca and 44.3–66.3% on ShareGPT"
# Outputs this many times ours, for the "what longer outputs would give" comparison.
LONGER_OUTPUTS = 5


def method(r: Results) -> list[str]:
    s = r.settings
    parallel, system = r.of_kind(PARALLEL), r.of_kind(SYSTEM)
    paragraphs = [
        f"Our engine in-process (`build_engine`, the allocator core in-process), model "
        f"`{r.model}`, float32 on the CPU ({threads(r.threads)}: on a shared machine two "
        "OpenMP threads waiting for each other made runs up to ten times slower, at random), "
        f"block size {BLOCK_SIZE}, at most "
        f"{s.max_batched_tokens} tokens per iteration, and a KV cache of {r.num_blocks:,} "
        f"blocks ({r.num_blocks * BLOCK_SIZE:,} tokens): more than any run holds, so nothing is "
        "preempted (a sanity row checks) and blocks in use measure sharing alone. Each case "
        "submits all its requests at once and steps the engine until they are done, once "
        "without sharing and once with, alternating which mode goes first; "
        f"{runs(s.rounds)}, and the fastest run of each mode counts."]
    if parallel:
        lengths = [len(prompt) for prompt in parallel[0].case.prompts]
        ns = ", ".join(str(pair.case.n) for pair in parallel)
        paragraphs.append(
            f"Parallel sampling, n = {ns}: {len(lengths)} prompts of random ordinary token ids, "
            f"lengths {s.prompt_lens.describe()} (drawn: {drawn_lengths(lengths)}), {s.output_len} "
            "output tokens per choice (end-of-sequence ignored), temperature 1, a seed per "
            "request. Shared: one request with `SamplingParams(n=n)`; the engine computes the "
            "prompt once and forks the other choices from its blocks (the partial last block "
            "is copied when a choice first writes into it). Not shared: n requests with n = 1 "
            "per prompt, each with its own cache salt (so neither fork nor the prefix cache "
            "shares a block) and the seed of the choice it stands for, so both modes draw the "
            "same random numbers.")
    for pair in system:
        case = pair.case
        paragraphs.append(
            f"Shared system prompt: {len(case.users)} requests, each one common "
            f"{len(case.system)}-token system prompt (random ids, {len(case.system) // BLOCK_SIZE}"
            f" full blocks) followed by a user part of its own ({s.user_lens.describe()}), "
            f"{s.output_len} greedy output tokens. Shared: one cache salt for all, so the prefix "
            "cache serves the system prompt's blocks to every request admitted after the first "
            "iteration computed them. Not shared: a cache salt per request.")
    paragraphs.append(
        "Blocks in use are counted after every iteration (`engine.step()`, whose Step has "
        "applied that iteration's allocations, forks, copies and frees): blocks some sequence "
        "holds, as the allocator's GetStats counts used blocks; freed blocks that still hold "
        "prefix-cache entries are not in use. The mean weights each count by its iteration's "
        "duration (block-seconds over seconds); the peak is the largest count. Saved = 1 − "
        "shared / not shared. Expected at peak is the saving the lengths alone predict once "
        "every sequence is at full length: the n − 1 extra copies of each prompt's full "
        "blocks over the n sequences' blocks (for the system prompt, all but one request's "
        "copy of its full blocks). Prompt tokens computed: prompt tokens minus those served "
        "from the prefix cache. Output tokens/s: every choice's tokens over the time from the "
        "first request in to the last token out.")
    return paragraphs


def discussion(r: Results) -> list[str]:
    paragraphs = []
    parallel = r.of_kind(PARALLEL)
    if parallel:
        output_len = r.settings.output_len
        prompts = parallel[0].case.prompts
        share = sum(len(p) // BLOCK_SIZE for p in prompts) / \
            sum(blocks_for(len(p) + output_len, BLOCK_SIZE) for p in prompts)
        measured = ", ".join(f"{pair.peak_saving:.0%}" for pair in parallel)
        expected = ", ".join(f"{pair.case.expected_peak_saving():.0%}" for pair in parallel)
        longer = ", ".join(f"{pair.case.expected_peak_saving(LONGER_OUTPUTS * output_len):.0%}"
                           for pair in parallel)
        ns = ", ".join(str(pair.case.n) for pair in parallel)
        low, high = PAPER_PARALLEL_RANGE
        inside = all(low <= pair.case.expected_peak_saving(LONGER_OUTPUTS * output_len) <= high
                     for pair in parallel)
        paragraphs.append(
            "Why parallel sampling saves what it does. Fork shares a prompt's full blocks, so "
            "once every choice is at full length the saving is (n − 1) / n of the share of a "
            "sequence's blocks that are full prompt blocks. With our chat-like prompts followed "
            f"by only {output_len} output tokens that share is {share:.0%}, so the peak saving "
            f"comes to {measured} for n = {ns} (the lengths predict {expected}). The mean over "
            "the run is another mix: early on a sequence holds mostly prompt, which sharing "
            "saves, later more and more output of its own, which it cannot; and without fork "
            "the n copies of each prompt take more prefill iterations (the prompt tokens "
            "computed column), so the two modes do not even run the same iterations. The vLLM "
            "paper (§6.3, "
            f"Fig. 15) reports {PAPER_PARALLEL} for n = 2, 4, 6, counting as we do (blocks saved "
            "by sharing over blocks without sharing), on traces whose outputs are longer than "
            "their prompts (Fig. 11: means of about 19 prompt and 58 output tokens for Alpaca, "
            "161 and 338 for ShareGPT), so a smaller share of each sequence is prompt. The "
            "saving is a property of the lengths, not of the allocator: were our outputs "
            f"{LONGER_OUTPUTS} times as long ({LONGER_OUTPUTS * output_len} tokens after the "
            f"same prompts), the same count would predict {longer}"
            + (", inside the paper's range." if inside else "."))
    paragraphs.append(
        "Beam search: pagedserve has none (`SamplingParams` has no beam width; every choice "
        "samples on its own), so the paper's beam search savings, "
        f"{PAPER_BEAM}, have no counterpart here. Beam candidates also share the generated "
        "tokens they have in common, not just the prompt, which is why those savings are the "
        "larger ones.")
    for pair in r.of_kind(SYSTEM):
        case, shared = pair.case, pair.best_shared
        served = round(shared.cached_tokens / len(case.system)) if case.system else 0
        paragraphs.append(
            f"Shared system prompt: {served} of {len(case.users)} requests found the system "
            f"prompt's {len(case.system) // BLOCK_SIZE} blocks in the prefix cache "
            f"({shared.cached_tokens:,} prompt tokens served from it); the other "
            f"{len(case.users) - served} were admitted in the first iteration, before any copy "
            "of it was computed, and computed and held their own. "
            f"Blocks in use fall by {pair.peak_saving:.0%} at the peak (the lengths predict at "
            f"most {case.expected_peak_saving():.0%}) and output tokens/s rises "
            f"{pair.speedup:.2f}×, since the shared run computes "
            f"{shared.prompt_tokens_computed:,} prompt tokens instead of "
            f"{pair.best_unshared.prompt_tokens_computed:,}. The paper's shared-prefix "
            "experiment (§6.4) reports throughput over another system (1.67× and 3.58× over "
            "Orca (Oracle) with 80- and 341-token prefixes), not blocks saved, so it is no "
            "yardstick for this row.")
    return paragraphs


def runs(count: int) -> str:
    return {1: "each mode runs once", 2: "each mode runs twice"}.get(
        count, f"each mode runs {count} times")


def threads(count: int) -> str:
    return "one torch thread" if count == 1 else f"{count} torch threads"
