"""The sampler's constraints: the grammar's bitmask, allowed_token_ids and logit_bias, and
where they sit in the order of steps (before the penalties and the logprobs)."""
from __future__ import annotations

import math

import pytest
import torch

from executor_service.engine.sampler import Sampler, SamplingRow, unpack_bitmask
from pagedserve.protocol.sampling_params import SamplingParams

VOCAB = 70  # three int32 words, the last one partly past the vocabulary


def bitmask_of(allowed: list[int], vocab: int = VOCAB) -> torch.Tensor:
    words = [0] * (-(-vocab // 32))
    for token in allowed:
        words[token // 32] |= 1 << (token % 32)
    # int32 words: bit 31 set is a negative number, as the grammar engine writes it.
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


def test_unpack_bitmask_reads_bit_b_of_word_w_as_token_32w_plus_b():
    allowed = [0, 5, 31, 32, 63, 69]
    mask = unpack_bitmask(bitmask_of(allowed).unsqueeze(0), VOCAB)
    assert mask.shape == (1, VOCAB)
    assert mask[0].nonzero().flatten().tolist() == allowed


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_only_tokens_the_grammar_allows_are_sampled(temperature):
    allowed = [3, 31, 40]
    logits = torch.randn(64, VOCAB, generator=torch.Generator().manual_seed(1)) * 4
    rows = [SamplingRow(SamplingParams(temperature=temperature), (), (),
                        token_mask=bitmask_of(allowed)) for _ in range(64)]
    tokens = Sampler(seed=0).sample(logits, rows).token_ids
    assert set(tokens) <= set(allowed)


def test_constrained_and_free_rows_share_a_batch():
    logits = torch.zeros(2, VOCAB)
    logits[:, 7] = 5.0
    rows = [SamplingRow(SamplingParams(temperature=0.0), (), (), token_mask=bitmask_of([9])),
            SamplingRow(SamplingParams(temperature=0.0), (), ())]
    assert Sampler().sample(logits, rows).token_ids == [9, 7]


def test_allowed_token_ids_restrict_and_logprobs_see_only_them():
    logits = torch.zeros(1, VOCAB)
    logits[0, 1] = 10.0
    row = SamplingRow(SamplingParams(temperature=0.0, allowed_token_ids=(4, 6), logprobs=2),
                      (), ())
    output = Sampler().sample(logits, [row])
    assert output.token_ids[0] in (4, 6)
    # Two equally likely survivors: each has log(1/2), every other token -inf.
    assert output.logprobs[0].logprob == pytest.approx(math.log(0.5))
    assert sorted(token for token, _ in output.logprobs[0].top) == [4, 6]


def test_logit_bias_is_added_before_the_repetition_penalty():
    # Token 2 (logit -1, seen) with bias 2.5 and penalty 2: biased first it is 1.5, then
    # divided: 0.75, above token 3's 0.6. Penalised first it would be -2 + 2.5 = 0.5, below.
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 2], logits[0, 3] = -1.0, 0.6
    row = SamplingRow(SamplingParams(temperature=0.0, repetition_penalty=2.0,
                                     logit_bias=((2, 2.5),)), (2,), ())
    assert Sampler().sample(logits, [row]).token_ids == [2]


def test_a_bias_of_minus_100_bans_and_plus_100_forces():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    best = int(logits[0].argmax())
    rows = [SamplingRow(SamplingParams(temperature=0.0, logit_bias=((best, -100.0),)), (), ()),
            SamplingRow(SamplingParams(temperature=1.0, logit_bias=((11, 100.0),)), (), ())]
    tokens = Sampler(seed=0).sample(logits, rows).token_ids
    assert tokens[0] != best and tokens[1] == 11
