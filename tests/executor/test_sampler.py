"""The sampler: greedy, truncation, temperature, seeds, penalties, logprobs; params and stops.

Statistical tests draw from fixed seeds, so they cannot flake; the odds in their comments say how
unlikely a failure would be for a correct sampler under any seed.
"""
from __future__ import annotations

import math

import pytest
import torch

from executor_service.engine.sampler import (Sampler, SamplingRow, apply_penalties, child_seed,
                                             make_generator)
from executor_service.engine.stop_check import finish_reason
from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.sampling_params import MAX_LOGPROBS, SamplingParams

VOCAB = 50
# A 4-token distribution whose truncations are easy to work out by hand.
PROBS_4 = [0.4, 0.3, 0.2, 0.1]
LOGITS_4 = [math.log(p) for p in PROBS_4]


def row(prompt=(0,), output=(), generator=None, **params) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), list(prompt), list(output), generator)


def random_logits(rows: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def draw_many(logits: list[float], draws: int, **params) -> torch.Tensor:
    """`draws` tokens for one row of logits, as a batch of identical rows in one call."""
    batch = torch.tensor([logits]).repeat(draws, 1)
    output = Sampler(seed=0).sample(batch, [row(**params) for _ in range(draws)])
    return torch.tensor(output.token_ids)


def test_greedy_takes_the_argmax_of_each_row():
    logits = random_logits(8)
    output = Sampler(seed=0).sample(logits, [row(temperature=0) for _ in range(8)])
    assert output.token_ids == logits.argmax(dim=-1).tolist()
    assert output.logprobs == [None] * 8


def test_greedy_ties_go_to_the_lowest_token_id():
    logits = torch.tensor([[1.0, 5.0, 5.0, 2.0], [7.0, 0.0, 7.0, 7.0], [0.0, 0.0, 0.0, 0.0]])
    output = Sampler(seed=0).sample(logits, [row(temperature=0) for _ in range(3)])
    assert output.token_ids == [1, 0, 0]


def test_bf16_logits_are_sampled_in_float32_and_left_untouched():
    logits = random_logits(4).to(torch.bfloat16)
    before = logits.clone()
    output = Sampler(seed=0).sample(logits, [row(temperature=0, repetition_penalty=2.0)] * 4)
    assert len(output.token_ids) == 4
    assert torch.equal(logits, before)


@pytest.mark.parametrize("temperature", [0.05, 1.0, 5.0, 100.0])
@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"top_p": 1e-3}, {"min_p": 1.0}])
def test_truncation_to_the_single_best_token_is_greedy_at_any_temperature(temperature,
                                                                          truncation):
    logits = random_logits(16, seed=1)
    rows = [row(temperature=temperature, **truncation) for _ in range(16)]
    assert Sampler(seed=0).sample(logits, rows).token_ids == logits.argmax(dim=-1).tolist()


def test_top_k_boundary_tie_goes_to_the_lowest_token_id():
    tokens = draw_many([1.0, 5.0, 5.0, 2.0], 200, top_k=1)
    assert set(tokens.tolist()) == {1}


# Each case: params and the tokens allowed to appear, with their renormalised probabilities.
# The least likely allowed token has probability >= 1/3 (top_k 3 of 8 slowly rising logits:
# about 0.30), so it is missing from 2,000 draws with odds below (2/3)**2000 < 1e-350. An
# excluded token would otherwise hold at least 10% of the mass, so it would show up too.
RISING_8 = [0.1 * i for i in range(8)]
ALLOWED_SET_CASES = [
    (RISING_8, {"top_k": 3}, {5, 6, 7}),
    (LOGITS_4, {"top_p": 0.65}, {0, 1}),        # 0.4 < 0.65 <= 0.4 + 0.3
    (LOGITS_4, {"min_p": 0.4}, {0, 1, 2}),      # floor 0.16: 0.1 goes
    # top_p counts the mass renormalised after top_k: 0.4/0.9 + 0.3/0.9 = 0.78 >= 0.75 keeps
    # {0, 1}; on the raw probabilities (0.7 < 0.75) token 2 would stay too.
    (LOGITS_4, {"top_k": 3, "top_p": 0.75}, {0, 1}),
    (LOGITS_4, {"top_k": 3, "min_p": 0.6}, {0, 1}),
]


@pytest.mark.parametrize(("logits", "params", "allowed"), ALLOWED_SET_CASES)
def test_truncated_sampling_draws_every_allowed_token_and_nothing_else(logits, params, allowed):
    tokens = draw_many(logits, 2000, **params)
    assert set(tokens.tolist()) == allowed


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_sampling_frequencies_follow_softmax_of_logits_over_temperature(temperature):
    draws = 20_000
    tokens = draw_many(LOGITS_4, draws, temperature=temperature)
    expected = torch.softmax(torch.tensor(LOGITS_4) / temperature, dim=0) * draws
    observed = torch.bincount(tokens, minlength=4).double()
    chi_square = float(((observed - expected) ** 2 / expected).sum())
    # 3 degrees of freedom: a correct sampler exceeds 30.7 with probability 1e-6. Sampling at
    # the wrong temperature (0.5 vs 1 or 1 vs 2) lands in the thousands.
    assert chi_square < 30.7


def _seeded_tokens(batches: list[tuple[int, int]], iterations: int = 20) -> list[int]:
    """Tokens of one seeded sequence over `iterations` steps. `batches` gives per step (rows in
    the batch, position of the sequence); the other rows are unseeded or seeded differently."""
    sampler = Sampler(seed=99)
    target = row(generator=make_generator(1234, "cpu"), temperature=0.8, top_k=20, top_p=0.95,
                 frequency_penalty=0.5, seed=1234)
    other_generator = make_generator(7, "cpu")
    for step in range(iterations):
        size, position = batches[step % len(batches)]
        # The sequence sees the same logits every run; the others see whatever.
        logits = random_logits(size, seed=1000 + step) * 0.3
        logits[position] = random_logits(1, seed=step)[0] * 0.3
        rows = []
        for i in range(size):
            if i == position:
                rows.append(target)
            elif i % 3 == 0:
                rows.append(row(generator=other_generator, seed=7, top_p=0.5))
            else:
                rows.append(row(temperature=0 if i % 2 else 1.5, min_p=0.1))
        token = sampler.sample(logits, rows).token_ids[position]
        target.output_token_ids.append(token)
    return list(target.output_token_ids)


def test_seeded_sequence_is_reproducible_whatever_shares_its_batch():
    alone = _seeded_tokens([(1, 0)])
    assert len(set(alone)) > 5  # really sampled, not stuck on one token
    assert _seeded_tokens([(1, 0)]) == alone
    assert _seeded_tokens([(5, 2), (8, 7), (3, 0), (6, 4)]) == alone
    assert _seeded_tokens([(2, 1), (7, 3)]) == alone


def test_different_seeds_give_different_tokens():
    logits = torch.zeros(1, VOCAB)
    runs = []
    for seed in (1, 2):
        generator = make_generator(seed, "cpu")
        runs.append([Sampler().sample(logits, [row(generator=generator, seed=seed)]).token_ids[0]
                     for _ in range(10)])
    assert runs[0] != runs[1]  # equal by chance with odds 50**-10


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_in_prompt_and_output():
    logits = torch.tensor([[2.0, -1.0, 3.0, -4.0, 5.0, 0.0]])
    apply_penalties(logits, [row(prompt=[0, 1, 0], output=[2, 3, 3], repetition_penalty=2.0)])
    assert logits.tolist() == [[1.0, -2.0, 1.5, -8.0, 5.0, 0.0]]


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    rows = [row(prompt=[0, 0, 3], output=[1, 2, 2], presence_penalty=0.5, frequency_penalty=0.25),
            row(prompt=[1], output=[1], presence_penalty=-1.0)]
    apply_penalties(logits, rows)
    # Row 0: token 1 once -> 1 - 0.5 - 0.25; token 2 twice -> 1 - 0.5 - 0.5.
    assert logits.tolist() == [[1.0, 0.25, 0.0, 1.0], [1.0, 2.0, 1.0, 1.0]]


def test_repetition_penalty_applies_before_presence_and_frequency():
    logits = torch.tensor([[3.0, 3.0]])
    apply_penalties(logits, [row(prompt=[], output=[0, 0], repetition_penalty=2.0,
                                 presence_penalty=0.5, frequency_penalty=0.25)])
    assert logits.tolist() == [[0.5, 3.0]]  # 3 / 2 - 0.5 - 2 * 0.25


def test_logprobs_are_log_softmax_of_penalised_logits_before_temperature_and_truncation():
    logits = random_logits(3, seed=5)
    rows = [row(prompt=[1, 2], output=[3], repetition_penalty=1.5, frequency_penalty=1.0,
                temperature=3.0, top_k=1, logprobs=5),
            row(output=[4, 4], presence_penalty=2.0, temperature=0, logprobs=0),
            row(temperature=0)]
    output = Sampler(seed=0).sample(logits, rows)

    penalised = logits.clone()
    apply_penalties(penalised, rows)
    expected = torch.log_softmax(penalised, dim=-1)
    # top_k=1 makes row 0 greedy on the penalised logits, yet its logprob is not 0.
    assert output.token_ids[:2] == penalised[:2].argmax(dim=-1).tolist()
    for i, n in ((0, 5), (1, 0)):
        result = output.logprobs[i]
        assert result.logprob == pytest.approx(float(expected[i, output.token_ids[i]]), abs=1e-6)
        assert len(result.top) == n
        values, ids = expected[i].topk(n) if n else (torch.empty(0), torch.empty(0))
        assert [token for token, _ in result.top] == ids.tolist()
        assert [value for _, value in result.top] == pytest.approx(values.tolist(), abs=1e-6)
    assert output.logprobs[0].logprob < -0.01
    assert output.logprobs[0].top == sorted(output.logprobs[0].top, key=lambda p: -p[1])
    assert output.logprobs[2] is None


def test_token_id_outside_vocabulary_in_penalty_history_is_a_caller_bug():
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 4\)"):
        apply_penalties(torch.zeros(1, 4), [row(prompt=[4], repetition_penalty=1.2)])


@pytest.mark.parametrize(("field", "value"), [
    ("n", 0), ("n", 129), ("max_tokens", 0), ("temperature", -1.0), ("temperature", 100.5),
    ("temperature", float("nan")), ("top_k", -1), ("top_k", VOCAB + 1), ("top_p", 0.0),
    ("top_p", 1.01), ("min_p", -0.1), ("min_p", 1.5), ("seed", -1), ("seed", 2**63),
    ("repetition_penalty", 0.0), ("repetition_penalty", 101.0), ("presence_penalty", 2.5),
    ("frequency_penalty", -2.01), ("stop_token_ids", (3, VOCAB)), ("stop_token_ids", (-1,)),
    ("logprobs", -1), ("logprobs", MAX_LOGPROBS + 1),
])
def test_validate_names_the_field_out_of_range(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be") as error:
        SamplingParams(**{field: value}).validate(VOCAB)
    assert isinstance(error.value, InvalidArgument)  # INVALID_ARGUMENT on the wire


def test_validate_accepts_the_edges_of_every_range():
    SamplingParams().validate(VOCAB)
    SamplingParams(n=128, max_tokens=1, temperature=0.0, top_k=VOCAB, top_p=1.0, min_p=1.0,
                   seed=2**63 - 1, repetition_penalty=100.0, presence_penalty=-2.0,
                   frequency_penalty=2.0, stop_token_ids=(0, VOCAB - 1),
                   logprobs=MAX_LOGPROBS).validate(VOCAB)
    assert SamplingParams(temperature=0.0).greedy and not SamplingParams().greedy


def test_child_seeds_are_distinct_and_stable():
    seeds = [child_seed(1234, index) for index in range(128)]
    assert len(set(seeds)) == 128
    assert seeds[0] == 1234  # the first completion of n equals the n=1 answer
    assert seeds[1] == 7535780496361781665
    assert all(0 <= seed < 2**63 for seed in seeds)
    assert child_seed(5, 1) != child_seed(6, 0)


EOS = {2, 9}


@pytest.mark.parametrize(("params", "output", "num_tokens", "expected"), [
    (SamplingParams(), [5], 4, None),
    (SamplingParams(), [5, 2], 5, "stop"),                        # eos
    (SamplingParams(), [2, 5], 5, None),                          # eos only counts when last
    (SamplingParams(ignore_eos=True), [5, 9], 5, None),
    (SamplingParams(stop_token_ids=(7,)), [7], 4, "stop"),
    (SamplingParams(stop_token_ids=(9,), ignore_eos=True), [9], 4, "stop"),
    (SamplingParams(max_tokens=2), [5, 6], 5, "length"),
    (SamplingParams(max_tokens=2), [5, 2], 5, "stop"),            # stop wins over length
    (SamplingParams(), [5, 6], 8, "length"),                      # context window full
    (SamplingParams(), [], 3, None),
])
def test_finish_reason(params, output, num_tokens, expected):
    assert finish_reason(params, output, EOS, num_tokens=num_tokens, max_model_len=8) == expected


def test_small_top_k_cuts_exactly_what_the_full_sort_cuts():
    """Many ties (logits rounded to a coarse grid), every row its own k and p, the last
    token id often kept: the candidates-only path must equal the full stable sort."""
    from executor_service.engine.sampler import _truncate_small_k, _truncate_sorted

    generator = torch.Generator().manual_seed(7)
    for trial in range(20):
        rows, vocab = 16, 64
        logits = (torch.randn(rows, vocab, generator=generator) * 2).round()
        logits[:, -1] = logits.max(dim=1).values  # the last id ties for the best
        top_k = torch.randint(1, 12, (rows,), generator=generator).tolist()
        top_p = [float("inf") if trial % 4 == 0 else
                 float(torch.rand(1, generator=generator)) * 0.9 + 0.05 for _ in range(rows)]
        small, full = logits.clone(), logits.clone()
        _truncate_small_k(small, top_k, top_p)
        _truncate_sorted(full, top_k, top_p)
        assert torch.equal(small.isinf(), full.isinf()), trial
