"""The allocator group's capacity in the fleet report: one allocator's CPU line, the group
replay's efficiency, and the spread of a growing, numbered fleet over the group's addresses."""
from __future__ import annotations

import math

from bench.fleet.replay import ReplayResult
from bench.fleet.report import FleetResults, Point, group_capacity, group_rows
from pagedserve.common.allocator_shards import LOAD_BOUND, balanced_owners

WINDOW_S = 20.0
FIXED, PER_EXECUTOR = 0.02, 0.008  # one allocator: 0.02 + 8 ms × N cores, 122.5 per core
SHARDS = ["10.0.0.1:50052", "10.0.0.2:50052", "10.0.0.3:50052", "10.0.0.4:50052"]


def results_with_group(shard_cores_scale: float) -> tuple[FleetResults, Point]:
    results = FleetResults("machine", "command", "workload", "timing")
    for n in (8, 16, 32, 64):
        results.points.append(Point(20.0, "memory", ReplayResult(
            n, WINDOW_S, steps=1, allocator_cpu_s=(FIXED + PER_EXECUTOR * n) * WINDOW_S)))
    owners = balanced_owners(40, SHARDS)
    spread = [owners.count(shard) for shard in SHARDS]
    cores = [(FIXED + PER_EXECUTOR * n) * shard_cores_scale for n in spread]
    group = Point(20.0, "memory", ReplayResult(
        40, WINDOW_S, steps=1, shard_targets=SHARDS, shard_executors=spread,
        shard_cpu_s=[c * WINDOW_S for c in cores], allocator_cpu_s=sum(cores) * WINDOW_S))
    results.group_points.append(group)
    # One allocator replayed beside the group at its executors per shard, costing the line.
    per_shard = 40 // len(SHARDS)
    for _ in ("before", "after"):
        results.group_references.append(Point(20.0, "memory", ReplayResult(
            per_shard, WINDOW_S, steps=1,
            allocator_cpu_s=(FIXED + PER_EXECUTOR * per_shard) * WINDOW_S)))
    return results, group


def largest_fleet(efficiency: float) -> tuple[int, list[int]]:
    """Grows the fleet by hand: executor k joins its shard unless that shard would pass a core."""
    counts = dict.fromkeys(SHARDS, 0)
    for k, owner in enumerate(balanced_owners(10_000, SHARDS)):
        if efficiency * (FIXED + PER_EXECUTOR * (counts[owner] + 1)) > 1:
            return k, [counts[shard] for shard in SHARDS]
        counts[owner] += 1
    raise AssertionError("the fleet never filled a shard")


def test_shards_that_cost_what_one_allocator_costs_fill_within_the_load_bound():
    results, group = results_with_group(1.0)
    capacity = group_capacity(results, group)
    assert math.isclose(capacity.efficiency, 1.0)
    assert math.isclose(capacity.single, (1 - FIXED) / PER_EXECUTOR)
    fleet, spread = largest_fleet(1.0)
    assert (capacity.executors, list(capacity.spread)) == (fleet, spread)
    # The busiest shard holds one allocator's executors; the others hold fewer.
    assert max(spread) == math.floor(capacity.single)
    assert sum(spread) == fleet < 4 * capacity.single
    assert math.isclose(capacity.ratio, fleet / capacity.single)
    # The busiest shard is at most LOAD_BOUND above an even share, so the group holds at
    # least 4 / LOAD_BOUND allocators (less the one executor that did not fit).
    assert fleet + 1 >= 4 * math.floor(capacity.single) / LOAD_BOUND
    # Other address lists spread the same fleet otherwise, but never past 4 allocators.
    assert capacity.single <= capacity.low_executors <= capacity.median_executors
    assert capacity.median_executors < 4 * capacity.single


def test_shards_that_cost_more_in_the_replay_hold_fewer():
    results, group = results_with_group(1.25)
    capacity = group_capacity(results, group)
    assert math.isclose(capacity.efficiency, 1.25)
    assert capacity.executors == largest_fleet(1.25)[0] < group_capacity(
        *results_with_group(1.0)).executors
    rows = {row.metric: row for row in group_rows(results)}
    target_row = next(row for metric, row in rows.items()
                      if metric.startswith("4 shards: the group's capacity"))
    assert target_row.met == (capacity.ratio >= 3.5)


def test_without_a_line_there_is_no_projection():
    results, group = results_with_group(1.0)
    results.points = results.points[:1]
    assert group_capacity(results, group) is None


def test_too_few_points_for_a_line_give_none():
    """Two or three unsaturated points are too few to extrapolate to a core: no line, no
    projection, and the report gives the median alone."""
    results, group = results_with_group(1.0)
    results.points = results.points[:3]
    assert results.cpu_line(20.0, "memory") is None
    assert group_capacity(results, group) is None
    results, _ = results_with_group(1.0)
    fixed, per_executor = results.cpu_line(20.0, "memory")
    assert math.isclose(fixed, FIXED) and math.isclose(per_executor, PER_EXECUTOR)


def test_without_the_shards_cpu_there_is_no_projection():
    results, group = results_with_group(1.0)
    group.result.shard_cpu_s = []
    assert group_capacity(results, group) is None


def test_without_the_replays_beside_the_group_there_is_no_projection():
    results, group = results_with_group(1.0)
    results.group_references = []
    assert group_capacity(results, group) is None


def test_efficiency_is_measured_against_one_allocator_replayed_beside_the_group():
    # The sweep ran on a quieter machine: the shards cost 1.3 times its line. One allocator
    # replayed right before and right after the group, at 10 executors, cost 1.2 and 1.4 times
    # the line's per-executor figure at 10: the group is as efficient as that, not 1.3 times
    # dearer.
    results, group = results_with_group(1.3)
    results.group_references = []
    alone = (FIXED + PER_EXECUTOR * 10) / 10
    for scale in (1.2, 1.4):
        results.group_references.append(Point(20.0, "memory", ReplayResult(
            10, WINDOW_S, steps=1, allocator_cpu_s=alone * scale * 10 * WINDOW_S)))
    r = group.result
    shards_per_executor = sum(r.shard_cpu_s) / WINDOW_S / sum(r.shard_executors)
    capacity = group_capacity(results, group)
    assert math.isclose(capacity.efficiency, shards_per_executor / (alone * 1.3))
    rows = {row.metric: row.measured for row in group_rows(results)}
    assert rows["20 ms, memory, one allocator at 10 executors, right before and right after: "
                "CPU per executor-second"] == (f"{alone * 1.2 * 1000:.1f} ms / "
                                               f"{alone * 1.4 * 1000:.1f} ms")
