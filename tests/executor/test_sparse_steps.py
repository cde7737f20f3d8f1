"""Sparse Steps: a steady decode sends the allocator one Append per sequence per block, not per
token, and copy-on-write stays exact: no sequence ever writes into a block another sequence
shares. The answers equal those of the per-token protocol (`sparse_steps=False`)."""
from __future__ import annotations

from pathlib import Path

import pytest

from allocator_service.core.audit import audit_pool
from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.engine.request import SequenceStatus
from pagedserve.protocol.block_ops import AppendOp
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint
from tests.support.shared_writes import shared_writes

BLOCK = 16
DECODING = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint("llama", tmp_path_factory.mktemp("llama"))


def engine_for(checkpoint: Path, **options):
    return build_engine(checkpoint, EngineOptions(num_blocks=256, block_size=BLOCK, **options),
                        LocalBlockAllocator())


class OpCounter:
    """Counts what an engine sends its allocator: Steps and Append ops."""

    def __init__(self, engine) -> None:
        self.steps = self.appends = 0
        submit = engine.allocator.submit

        def counted(ops):
            self.steps += 1
            self.appends += sum(isinstance(op, AppendOp) for op in ops)
            return submit(ops)

        engine.allocator.submit = counted


def decode_steadily(engine, num_seqs: int, prompt_len: int) -> None:
    """Admits `num_seqs` greedy requests and steps until every one is decoding."""
    for index, prompt in enumerate(random_prompts([prompt_len] * num_seqs, seed=3)):
        engine.add_request(f"r{index}", prompt, DECODING)
    while any(seq.status is not SequenceStatus.RUNNING or not seq.is_decoding
              for request in engine.requests.values() for seq in request.sequences):
        engine.step()


@pytest.mark.parametrize("sparse, reserve_blocks, appends_per_iteration",
                         [(True, 1, 32 / BLOCK), (True, 2, 32 / (2 * BLOCK)), (False, 1, 32)])
def test_a_steady_decode_sends_one_append_per_sequence_per_block(checkpoint, sparse,
                                                                 reserve_blocks,
                                                                 appends_per_iteration):
    """32 sequences decoding: sparse, one Append per sequence per block (per two blocks when
    each Append reserves two); per token, one every iteration."""
    engine = engine_for(checkpoint, sparse_steps=sparse, reserve_blocks=reserve_blocks)
    decode_steadily(engine, num_seqs=32, prompt_len=9)
    # The first decodes publish the prompt and bring each reserve onto a block boundary.
    for _ in range(BLOCK):
        engine.step()
    counter = OpCounter(engine)
    stalls = engine.scheduler.num_stalls
    iterations = 4 * BLOCK
    for _ in range(iterations):
        engine.step()
    assert counter.appends == appends_per_iteration * iterations
    assert engine.scheduler.num_stalls == stalls == 0
    if sparse:
        # Every sequence's Append falls in the same iterations: a Step every 16th one (32nd).
        assert counter.steps == iterations // (reserve_blocks * BLOCK)


def test_every_full_block_reaches_the_prefix_cache_when_the_next_is_reserved(checkpoint):
    engine = engine_for(checkpoint)
    decode_steadily(engine, num_seqs=1, prompt_len=9)
    for _ in range(3 * BLOCK):
        engine.step()
    (seq,) = engine.requests["r0"].sequences
    recorded = engine.allocator.pool.sequences[seq.seq_id]
    # The allocator knows the tokens up to the last Append (the mirror learns of it when the
    # engine reads that Step's answer, which may still be out), and has hashed every block
    # that was full and computed then; the executor is never more than a block ahead of it.
    assert seq.num_reported <= recorded.num_tokens <= len(seq.token_ids)
    assert len(seq.token_ids) - recorded.num_tokens <= BLOCK
    assert recorded.num_hashed_blocks == recorded.num_computed_tokens // BLOCK
    assert seq.num_computed // BLOCK - recorded.num_hashed_blocks <= 1


@pytest.mark.parametrize("lookahead_slots", [4, BLOCK])
def test_no_sequence_writes_into_a_block_another_shares(checkpoint, lookahead_slots):
    """n > 1 forks share the prompt's blocks, the last one partly filled; prefix-cache hits
    share full blocks. Before every forward pass, each slot written must lie in a block of
    reference count 1, as the allocator's own pool says. With a whole block reserved at
    admission a forked child already holds its next slots: only copy-on-write makes it ask."""
    engine = engine_for(checkpoint, lookahead_slots=lookahead_slots)
    pool = engine.allocator.pool
    written_shared = shared_writes(engine)
    shared, other = random_prompts([40, 23], seed=9)
    prompts = [shared, shared + [5, 6, 7], other, shared]
    params = [SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=35, ignore_eos=True),
              SamplingParams(n=3, temperature=0.8, seed=11, max_tokens=30, ignore_eos=True),
              SamplingParams(n=2, temperature=1.0, seed=13, max_tokens=20, ignore_eos=True)]
    sparse = generate(engine, prompts, params)
    assert written_shared == []
    assert audit_pool("local", pool) == []
    per_token = generate(engine_for(checkpoint, sparse_steps=False,
                                    lookahead_slots=lookahead_slots), prompts, params)
    assert [c.choices for c in sparse] == [c.choices for c in per_token]


def test_coalesced_steps_go_out_once_every_interval_in_a_steady_decode(checkpoint):
    """Prompts of staggered lengths make some sequence need a block nearly every iteration;
    with step_interval 4 those Appends wait for the fourth, and no sequence runs dry."""
    engine = engine_for(checkpoint, step_interval=4)
    for index, prompt in enumerate(random_prompts(list(range(5, 5 + 2 * BLOCK)), seed=5)):
        engine.add_request(f"r{index}", prompt, DECODING)
    for _ in range(BLOCK):  # admission and prefill; every reserve comes onto a block boundary
        engine.step()
    assert all(seq.is_decoding for request in engine.requests.values()
               for seq in request.sequences)
    counter = OpCounter(engine)
    iterations = 4 * BLOCK
    for _ in range(iterations):
        engine.step()
    assert counter.steps == iterations // 4
    assert counter.appends == 2 * BLOCK * iterations // BLOCK
    assert engine.scheduler.num_stalls == 0


def mixed_workload(max_tokens: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Forks (n > 1, so copy-on-write), prefix hits (a prompt repeated, one extended) and plain
    greedy requests; the longest asks `max_tokens`."""
    shared, other = random_prompts([40, 23], seed=9)
    prompts = [shared, shared + [5, 6, 7], other, shared, other[:9]]
    params = [SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=max_tokens * 4 // 5,
                             ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=max_tokens * 7 // 10, ignore_eos=True),
              SamplingParams(n=3, temperature=0.8, seed=11, max_tokens=max_tokens * 3 // 5,
                             ignore_eos=True),
              SamplingParams(n=2, temperature=1.0, seed=13, max_tokens=max_tokens * 2 // 5,
                             ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)]
    return prompts, params


def checked_generate(checkpoint: Path, max_tokens: int, **options):
    """The mixed workload on an engine built with `options`, checked as it runs: no write into
    a shared block, no stall, every sequence freed, a clean audit. The choices and the count
    of what was sent to the allocator."""
    engine = engine_for(checkpoint, **options)
    pool = engine.allocator.pool
    written_shared = shared_writes(engine)
    counter = OpCounter(engine)
    choices = [c.choices for c in generate(engine, *mixed_workload(max_tokens))]
    assert written_shared == []
    assert engine.scheduler.num_stalls == 0
    assert not pool.sequences
    assert audit_pool("local", pool) == []
    return choices, counter


def test_coalesced_steps_answer_what_a_step_per_iteration_answers(checkpoint):
    """Forks, copy-on-write and prefix hits with Steps put off: the same tokens, fewer Steps."""
    every, every_steps = checked_generate(checkpoint, 50, step_interval=1)
    coalesced, coalesced_steps = checked_generate(checkpoint, 50, step_interval=4)
    assert coalesced == every
    assert coalesced_steps.steps < every_steps.steps


def test_a_two_block_reserve_answers_the_same_with_fewer_appends(checkpoint):
    """Forks, copy-on-write and prefix hits with every Append reserving two blocks: the same
    tokens as with one, fewer Appends."""
    one, one_ops = checked_generate(checkpoint, 90, reserve_blocks=1)
    two, two_ops = checked_generate(checkpoint, 90, reserve_blocks=2)
    assert two == one
    assert two_ops.appends < one_ops.appends
