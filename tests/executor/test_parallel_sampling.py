"""n > 1: the prompt is computed once and its blocks are forked, not copied; a seed makes all n
choices reproducible whatever else is in the batch."""
from __future__ import annotations

from pathlib import Path

import pytest

from allocator_service.core.audit import audit_pool
from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from pagedserve.protocol.sampling_params import SamplingParams
from tests.support.model_checkpoints import random_prompts, write_checkpoint

PROMPT_LEN = 40        # two full blocks of 16 and a shared partial third
SEEDED = SamplingParams(n=4, temperature=1.0, top_p=0.95, seed=1234, max_tokens=12,
                        ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint("llama", tmp_path_factory.mktemp("llama"))


def pool_of(engine):
    return engine.allocator.pool


def test_seeded_n4_is_reproducible_and_independent_of_the_batch(checkpoint):
    (prompt,) = random_prompts([PROMPT_LEN], seed=5)
    (alone,) = generate(build_engine(checkpoint, EngineOptions(num_blocks=64),
                                     LocalBlockAllocator()), [prompt],
                        SEEDED)
    others = random_prompts([7, 30], seed=6)
    crowded = generate(build_engine(checkpoint, EngineOptions(num_blocks=64),
                                    LocalBlockAllocator()),
                       [others[0], prompt, others[1]],
                       [SamplingParams(temperature=1.0, max_tokens=20), SEEDED,
                        SamplingParams(n=3, temperature=0.7, max_tokens=5)])
    assert crowded[1].choices == alone.choices
    assert len({tuple(choice) for choice in alone.choices}) > 1, "the choices should differ"
    # Choice 0 keeps the request's seed, so it is what n = 1 with that seed gives.
    (single,) = generate(build_engine(checkpoint, EngineOptions(num_blocks=64),
                                      LocalBlockAllocator()), [prompt],
                         SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=12,
                                        ignore_eos=True))
    assert single.choices[0] == alone.choices[0]
    assert alone.usage.completion_tokens == 4 * 12


def test_fork_shares_the_prompt_blocks_instead_of_copying_them(checkpoint):
    (prompt,) = random_prompts([PROMPT_LEN], seed=8)
    engine = build_engine(checkpoint, EngineOptions(num_blocks=64), LocalBlockAllocator())
    engine.add_request("fan-out", prompt, SEEDED)
    while len(pool_of(engine).sequences) < 4:
        engine.step()
    engine.step()  # every child has written its first token: copy-on-write has happened
    pool = pool_of(engine)
    tables = [seq.block_table for seq in pool.sequences.values()]
    full_prompt_blocks = PROMPT_LEN // 16
    shared = {table[0] for table in tables}, {table[1] for table in tables}
    assert all(len(ids) == 1 for ids in shared), "the full prompt blocks are one copy"
    assert all(pool.blocks.ref_count(table[0]) == 4 for table in tables)
    # The partial third block was copied on write for all but one of the four writers.
    thirds = {table[full_prompt_blocks] for table in tables}
    assert len(thirds) == 4
    assert audit_pool("fan-out", pool) == []
    while engine.has_work():
        engine.step()
    assert pool.sequences == {}
    assert audit_pool("fan-out", pool) == []
