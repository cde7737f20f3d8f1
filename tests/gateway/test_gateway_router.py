"""The gateway's routing score: exact prefix overlap against load, overload, ties."""
from __future__ import annotations

import pytest

from gateway.executors.router import OVERLOAD_WAITING, Candidate, choose, score


def candidate(executor_id: str, cached: int = 0, free: int = 100, waiting: int = 0,
              open_requests: int = 0) -> Candidate:
    return Candidate(executor_id, cached_tokens=cached, free_blocks=free, num_blocks=100,
                     num_waiting=waiting, num_open=open_requests)


def test_a_long_shared_prefix_goes_where_it_is_cached():
    holder, other = candidate("b", cached=512), candidate("a")
    assert choose([other, holder], prompt_len=530).executor_id == "b"


def test_the_holder_keeps_winning_while_it_carries_a_fair_share_of_the_load():
    holder, other = candidate("b", cached=512, open_requests=5), candidate("a", open_requests=3)
    assert choose([other, holder], prompt_len=530).executor_id == "b"


def test_an_overloaded_holder_loses_its_prefix_advantage():
    holder = candidate("b", cached=512, waiting=OVERLOAD_WAITING)
    assert choose([candidate("a"), holder], prompt_len=530).executor_id == "a"
    nearly_full = candidate("b", cached=512, free=3)
    assert choose([candidate("a"), nearly_full], prompt_len=530).executor_id == "a"


def test_without_overlap_the_less_loaded_executor_wins():
    busy, idle = candidate("a", open_requests=4), candidate("b", open_requests=1)
    assert choose([busy, idle], prompt_len=100).executor_id == "b"
    fuller, emptier = candidate("a", free=20), candidate("b", free=90)
    assert choose([fuller, emptier], prompt_len=100).executor_id == "b"


def test_ties_go_to_the_lower_id():
    assert choose([candidate("b"), candidate("a"), candidate("ab")], 10).executor_id == "a"


def test_score_is_overlap_minus_weighted_kv_usage_and_load_share():
    assert score(candidate("a", cached=50, free=60, open_requests=1), 100, total_open=3) == \
        pytest.approx(0.5 - 0.5 * 0.4 - 1.0 * 0.25)


def test_choosing_among_nobody_is_a_caller_bug():
    with pytest.raises(ValueError):
        choose([], 10)
