"""Executor registration (validation, epochs, stale and unknown executors) and leases."""
from __future__ import annotations

import sys

import pytest

from allocator_service.core.allocator import Allocator
from allocator_service.core.errors import ExecutorIndexTaken, StaleEpoch, UnknownExecutor
from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.block_ops import AllocateOp, FreeOp
from pagedserve.protocol.limits import Limits
from tests.support.allocator_core import A9, BLOCK_SIZE, NUM_BLOCKS, free_ids, registered


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- registration ---------------------------------------------------------------------------------

@pytest.mark.parametrize("executor_id, address, num_blocks, block_size", [
    ("e", "h", 0, 4),
    ("e", "h", -1, 4),
    ("e", "h", 17, 4),
    ("e", "h", 11, 0),
    ("e", "h", 11, 4097),
    ("", "h", 11, 4),
    ("x" * 257, "h", 11, 4),
    ("e", "a" * 257, 11, 4),
], ids=["no_blocks", "negative_blocks", "blocks_over_limit", "block_size_0",
        "block_size_over_limit", "empty_executor_id", "long_executor_id", "long_address"])
def test_invalid_registration_raises_invalid_argument(executor_id, address, num_blocks,
                                                      block_size):
    allocator = Allocator(limits=Limits(max_num_blocks=16))
    with pytest.raises(InvalidArgument):
        allocator.register_executor(executor_id, address, num_blocks, block_size, "m")
    assert allocator.executors == {}
    # A refused registration consumes no epoch; the limit itself is accepted.
    assert allocator.register_executor("e", "h", 16, 4096, "m").epoch == 1


def test_reregistration_gives_larger_epoch_and_empty_pool():
    allocator, _ = registered()
    allocator.step("e", 1, 1, [AllocateOp("a", tuple(range(6)))])
    assert allocator.register_executor("f", "h", 3, 2, "m").epoch == 2

    second = allocator.register_executor("e", "host:2", 5, 2, "m2")
    assert second.epoch == 3
    assert allocator.executors["e"] is second
    assert second.pool.sequences == {}
    assert (second.pool.num_blocks, second.pool.block_size) == (5, 2)
    assert free_ids(second.pool) == [0, 1, 2, 3, 4]
    assert second.last_step_id == 0
    # Step ids start over with the new epoch.
    assert allocator.step("e", 3, 1, [AllocateOp("a", (1,))]).replayed is False


def test_stale_epoch_raises():
    allocator, _ = registered()
    allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    with pytest.raises(StaleEpoch, match="sent epoch 1 but its pool is at epoch 2"):
        allocator.step("e", 1, 1, [AllocateOp("a", (1,))])
    with pytest.raises(StaleEpoch):
        allocator.heartbeat("e", 1)
    assert allocator.executors["e"].pool.sequences == {}


def test_unknown_executor_raises():
    allocator, _ = registered()
    with pytest.raises(UnknownExecutor):
        allocator.step("ghost", 1, 1, [])
    with pytest.raises(UnknownExecutor):
        allocator.heartbeat("ghost", 1)
    with pytest.raises(UnknownExecutor):
        allocator.reset_prefix_cache("ghost")


# -- leases ---------------------------------------------------------------------------------------

def test_lease_expiry_reclaims_pool_whole():
    clock = FakeClock(100.0)
    allocator = Allocator(lease_ttl_s=10.0, clock=clock)
    executor = allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    allocator.step("e", 1, 1, [AllocateOp("a", tuple(A9))])

    clock.now = 109.0
    assert allocator.expire_leases() == []
    assert allocator.lease_remaining(executor) == 1.0
    clock.now = 110.0
    assert allocator.expire_leases() == ["e"]
    assert allocator.executors == {}
    assert allocator.match_prefix(A9, "") == []
    with pytest.raises(UnknownExecutor):
        allocator.step("e", 1, 2, [FreeOp("a")])

    again = allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    assert again.epoch == 2
    assert free_ids(again.pool) == list(range(11))


def test_heartbeat_renews_lease():
    clock = FakeClock(100.0)
    allocator = Allocator(lease_ttl_s=10.0, clock=clock)
    e = allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    allocator.register_executor("f", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    clock.now = 109.0
    allocator.heartbeat("e", 1, num_waiting=3, num_running=-2)
    assert (e.num_waiting, e.num_running) == (3, 0)
    clock.now = 110.0
    assert allocator.expire_leases() == ["f"]
    assert allocator.lease_remaining(e) == 9.0
    clock.now = 119.0
    assert allocator.expire_leases() == ["e"]


def test_step_renews_lease():
    clock = FakeClock(100.0)
    allocator = Allocator(lease_ttl_s=10.0, clock=clock)
    e = allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m")
    clock.now = 105.0
    allocator.step("e", 1, 1, [])
    clock.now = 114.0
    assert allocator.expire_leases() == []
    assert allocator.lease_remaining(e) == 1.0
    # A replayed step is a sign of life too.
    allocator.step("e", 1, 1, [])
    clock.now = 123.0
    assert allocator.expire_leases() == []
    clock.now = 124.0
    assert allocator.expire_leases() == ["e"]


# -- a dropped pool leaves no garbage cycle ------------------------------------------------------
# The allocator service keeps its pools out of the cyclic garbage collector (server/heap.py), so
# a pool it drops must be freed by reference counting alone: its free list is unlinked.

def only_this_test_holds(pool: object) -> bool:
    """Nothing but the caller's name refers to `pool`: a pool makes no reference cycles (its
    blocks are arrays of ids), so once the allocator lets go it is freed by reference counting
    at once, never left for the cyclic collector, which the allocator keeps away from pools."""
    return sys.getrefcount(pool) == 3  # the caller's name, this argument, getrefcount's own


def test_a_reregistered_executors_old_pool_is_freed_at_once():
    allocator, executor = registered()
    old_pool = executor.pool
    del executor
    assert not only_this_test_holds(old_pool)
    allocator.register_executor("e", "host:1", NUM_BLOCKS, BLOCK_SIZE, "m")
    assert only_this_test_holds(old_pool)
    assert allocator.executors["e"].pool.num_free_blocks == NUM_BLOCKS


def test_a_reclaimed_pool_is_freed_at_once():
    clock = FakeClock()
    allocator, executor = registered(clock=clock, lease_ttl_s=5.0)
    old_pool = executor.pool
    del executor
    clock.now = 6.0
    assert allocator.expire_leases() == ["e"]
    assert only_this_test_holds(old_pool)


# -- executor indexes ------------------------------------------------------------------------------

def test_a_second_executor_with_a_taken_index_is_refused_and_changes_nothing():
    clock = FakeClock()
    allocator = Allocator(lease_ttl_s=5.0, clock=clock)
    allocator.register_executor("gpu0", "h:1", NUM_BLOCKS, BLOCK_SIZE, "m", executor_index=0)
    allocator.register_executor("gpu1", "h:2", NUM_BLOCKS, BLOCK_SIZE, "m", executor_index=1)
    clock.now = 2.0
    with pytest.raises(ExecutorIndexTaken,
                       match=r"executor 'copy' registers as executor index 1, which executor "
                             r"'gpu1' holds \(its lease lapses in 3.0 s unless renewed\): give "
                             r"every executor of the fleet its own --executor-index, or none"):
        allocator.register_executor("copy", "h:3", NUM_BLOCKS, BLOCK_SIZE, "m", executor_index=1)
    assert sorted(allocator.executors) == ["gpu0", "gpu1"]
    assert allocator.last_epoch == 2   # the refusal consumed no epoch
    # Without a number, or with a free one, it registers.
    assert allocator.register_executor("copy", "h:3", NUM_BLOCKS, BLOCK_SIZE, "m").epoch == 3
    assert allocator.register_executor("gpu2", "h:4", NUM_BLOCKS, BLOCK_SIZE, "m",
                                       executor_index=2).executor_index == 2
    assert [ex.executor_index for ex in allocator.sorted_executors()] == [None, 0, 1, 2]


def test_an_executor_re_registers_with_its_own_index_and_may_change_it():
    allocator = Allocator()
    allocator.register_executor("gpu0", "h:1", NUM_BLOCKS, BLOCK_SIZE, "m", executor_index=0)
    assert allocator.register_executor("gpu0", "h:1", NUM_BLOCKS, BLOCK_SIZE, "m",
                                       executor_index=0).epoch == 2
    allocator.register_executor("gpu0", "h:1", NUM_BLOCKS, BLOCK_SIZE, "m", executor_index=5)
    # Index 0 is free again once its holder took another.
    allocator.register_executor("gpu1", "h:2", NUM_BLOCKS, BLOCK_SIZE, "m", executor_index=0)
    assert {eid: ex.executor_index for eid, ex in allocator.executors.items()} == {
        "gpu0": 5, "gpu1": 0}


def test_an_index_is_free_once_its_holders_pool_is_reclaimed():
    clock = FakeClock()
    allocator = Allocator(lease_ttl_s=5.0, clock=clock)
    allocator.register_executor("old", "h:1", NUM_BLOCKS, BLOCK_SIZE, "m", executor_index=3)
    clock.now = 6.0
    # Lapsed but not yet reclaimed: the index is still held (the check reads journaled state
    # only, so a replay of the journal decides as the live allocator did).
    with pytest.raises(ExecutorIndexTaken, match="lapses in 0.0 s"):
        allocator.register_executor("new", "h:2", NUM_BLOCKS, BLOCK_SIZE, "m", executor_index=3)
    assert allocator.expire_leases() == ["old"]
    assert allocator.register_executor("new", "h:2", NUM_BLOCKS, BLOCK_SIZE, "m",
                                       executor_index=3).executor_index == 3


def test_a_negative_index_is_invalid():
    allocator = Allocator()
    with pytest.raises(InvalidArgument, match="executor_index must be 0 or more .* got -1"):
        allocator.register_executor("e", "h", NUM_BLOCKS, BLOCK_SIZE, "m", executor_index=-1)
    assert allocator.executors == {}


def test_a_pools_token_slots_are_bounded_and_executors_size_within_the_bound():
    """The allocator keeps a token array of a pool's whole size, so a pool's slots are bounded,
    and an executor sizing its cache from memory stays inside the bound at any block size."""
    limits = Limits()
    assert limits.max_blocks_of(16) == limits.max_num_blocks
    assert limits.max_blocks_of(4096) == limits.max_pool_slots // 4096 == 32768
    allocator = Allocator()
    allocator.register_executor("e", "host:1", limits.max_blocks_of(4096), 4096, "m")
    with pytest.raises(InvalidArgument, match="a pool may have 32768 blocks"):
        allocator.register_executor("f", "host:1", 32769, 4096, "m")
