"""bench/fleet/batching_model.py: the queueing model behind answering a turn's Steps one by one
(allocator_service/server/step_handler.py), on arrivals small enough to work out by hand."""
from __future__ import annotations

import pytest

from bench.fleet.batching_model import latencies, poisson_arrivals
from bench.report import percentile


def test_steps_of_one_turn_wait_for_the_last_only_when_answered_together() -> None:
    arrivals = [(0.0, 1.0), (0.0, 2.0)]   # both in the first turn: applied at 1, then at 3
    assert latencies(arrivals, together=True) == [3.0, 3.0]
    assert latencies(arrivals, together=False) == [1.0, 3.0]


def test_a_step_that_arrives_while_the_server_is_busy_starts_the_next_turn() -> None:
    # The first turn holds only the first Step (busy until 2); the second arrived at 1.
    arrivals = [(0.0, 2.0), (1.0, 1.0), (5.0, 1.0)]
    for together in (True, False):
        assert latencies(arrivals, together) == [2.0, 2.0, 1.0]


@pytest.mark.parametrize("load", [0.5, 0.8])
def test_one_by_one_never_answers_a_step_later_and_lowers_p99_near_a_core(load: float) -> None:
    service_s = [0.0002, 0.0003, 0.0004, 0.001]
    arrivals = poisson_arrivals(service_s, load, 20_000, seed=1)
    together = latencies(arrivals, together=True)
    one_by_one = latencies(arrivals, together=False)
    assert all(alone <= grouped for alone, grouped in zip(one_by_one, together))
    assert percentile(one_by_one, 99) < percentile(together, 99)
