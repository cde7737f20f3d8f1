"""The allocator group: which shard owns which executor (rendezvous hashing, by index or by
id), the merged view of the shards (exactly what one allocator holding every pool reports), and
pagedctl against two real shards."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from allocator_service.core.allocator import Allocator
from allocator_service.core.inspection import pool_stats, total_stats
from allocator_service.server.convert import pool_stats_to_proto
from executor_service.config import parse_config
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.allocator_group import total_of
from pagedserve.common.allocator_shards import (LOAD_BOUND, balanced_owners, executor_shard,
                                               parse_allocator_group, shard_of)
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, ForkOp
from pagedserve.supervisor.service_process import REPO_ROOT, hermetic_env
from tests.support.allocator_group import Shards
from tests.support.allocator_wire import allocate, register

pytestmark = pytest.mark.timeout(60)
SHARDS = ("alloc-0:50052", "alloc-1:50052", "alloc-2:50052", "alloc-3:50052")


# -- the assignment ------------------------------------------------------------------------------

def test_a_group_is_a_comma_separated_list_of_addresses():
    assert parse_allocator_group("a:1") == ("a:1",)
    assert parse_allocator_group(" a:1, b:2 ,[::1]:3") == ("a:1", "b:2", "[::1]:3")
    for text, message in [("", "is empty"), ("a:1,", "is empty"), ("a:1,,b:2", "is empty"),
                          ("a", "'a' is not HOST:PORT"), ("a:x", "'a:x' is not HOST:PORT"),
                          (":1", "':1' is not HOST:PORT"), ("a:70000", "is not HOST:PORT"),
                          ("a:1,b:2,a:1", "allocator a:1 is listed twice")]:
        with pytest.raises(ValueError, match=message):
            parse_allocator_group(text)


def test_the_owner_is_fixed_by_the_ids_and_addresses_alone():
    # Pinned: a change to the hash would move every pool of a running fleet on upgrade.
    owners = [shard_of(f"executor-{n}", SHARDS) for n in range(8)]
    assert owners == [SHARDS[3], SHARDS[3], SHARDS[2], SHARDS[0], SHARDS[1], SHARDS[2],
                      SHARDS[1], SHARDS[1]]
    reordered = tuple(reversed(SHARDS))
    assert owners == [shard_of(f"executor-{n}", reordered) for n in range(8)]
    assert shard_of("anything", SHARDS[:1]) == SHARDS[0]
    with pytest.raises(ValueError):
        shard_of("x", ())


def test_executors_spread_evenly_and_a_new_shard_takes_only_its_share():
    ids = [f"gpu-node-{n // 8}-{n % 8}" for n in range(4000)]
    owners = {executor_id: shard_of(executor_id, SHARDS) for executor_id in ids}
    counts = Counter(owners.values())
    assert set(counts) == set(SHARDS)
    assert all(abs(count - 1000) < 100 for count in counts.values()), counts
    grown = (*SHARDS, "alloc-4:50052")
    moved = [executor_id for executor_id in ids if shard_of(executor_id, grown) != owners[
        executor_id]]
    # Only pools the new shard now owns move, about a fifth of them; none between old shards.
    assert all(shard_of(executor_id, grown) == "alloc-4:50052" for executor_id in moved)
    assert 0.17 < len(moved) / len(ids) < 0.23
    shrunk = SHARDS[1:]
    assert all(shard_of(executor_id, shrunk) == owner for executor_id, owner in owners.items()
               if owner != SHARDS[0]), "removing a shard moves only its own pools"


def test_a_numbered_fleet_is_placed_by_index_the_same_everywhere():
    # Pinned, as the ids are: a change would move the pools of every numbered fleet.
    owners = balanced_owners(8, SHARDS)
    assert owners == [SHARDS[3], SHARDS[1], SHARDS[2], SHARDS[0], SHARDS[1], SHARDS[0],
                      SHARDS[2], SHARDS[3]]
    assert owners == balanced_owners(8, tuple(reversed(SHARDS)))
    assert balanced_owners(100, SHARDS)[:8] == owners, "a larger fleet places its first alike"
    # The index alone decides: the id does not enter, and each index is its own question.
    assert [executor_shard("any-name", k, SHARDS) for k in range(8)] == owners
    assert executor_shard("executor-3", None, SHARDS) == shard_of("executor-3", SHARDS)
    with pytest.raises(ValueError, match="0 or more"):
        executor_shard("x", -1, SHARDS)


def test_every_numbered_fleet_is_even_within_the_load_bound():
    owners = balanced_owners(4000, SHARDS)
    held = Counter()
    for placed, owner in enumerate(owners, start=1):
        held[owner] += 1
        busiest = max(held.values())
        assert busiest <= max(-(-placed // 4), LOAD_BOUND * placed / 4), placed
        if placed <= 36:  # a small fleet: exactly even
            assert busiest - min(held[shard] for shard in SHARDS) <= 1, placed
    # By id, the same fleet's first 400 spread as a random draw; by index, within 10 %.
    by_id = Counter(shard_of(f"executor-{k}", SHARDS) for k in range(400))
    assert max(Counter(owners[:400]).values()) <= 110 < max(by_id.values())


def test_a_new_shard_moves_a_bounded_share_of_a_numbered_fleet():
    owners = balanced_owners(400, SHARDS)
    grown = (*SHARDS, "alloc-4:50052")
    moved = [k for k, owner in enumerate(balanced_owners(400, grown)) if owner != owners[k]]
    # A fifth must move to fill the new shard; the bound moves some more between old ones.
    assert 0.2 <= len(moved) / 400 < 0.33, len(moved)
    shrunk = SHARDS[1:]
    kept = [k for k, owner in enumerate(balanced_owners(400, shrunk))
            if owners[k] != SHARDS[0] and owner == owners[k]]
    assert len(kept) / 300 > 0.8, "removing a shard leaves most of the others' pools"


def test_an_executor_is_numbered_by_flag_or_environment_and_refuses_a_bad_number(monkeypatch):
    group = ["--allocator", ",".join(SHARDS)]
    assert parse_config(group).executor_index is None, "unnumbered: its id picks the shard"
    assert parse_config([*group, "--executor-index", "5"]).executor_index == 5
    monkeypatch.setenv("PAGEDSERVE_EXECUTOR_INDEX", "7")
    assert parse_config(group).executor_index == 7
    assert parse_config([*group, "--executor-index", "-1"]).executor_index is None
    with pytest.raises(SystemExit):
        parse_config([*group, "--executor-index", "two"])
    with pytest.raises(SystemExit, match="--executor-index must be 0 or more"):
        parse_config([*group, "--executor-index", "-2"])


# -- the merged view -----------------------------------------------------------------------------

def test_the_merged_total_is_what_one_allocator_holding_every_pool_reports():
    core = Allocator()
    a = core.register_executor("a", "host:1", 16, 4, "m")
    b = core.register_executor("b", "host:2", 8, 4, "m")
    c = core.register_executor("c", "host:3", 8, 8, "m")
    core.step("a", a.epoch, 1, [AllocateOp("s1", tuple(range(10))), ForkOp("s1", "s2"),
                                AppendOp("s2", (7, 7, 7)),
                                AllocateOp("s3", tuple(range(9)))])   # a prefix hit on s1
    core.step("b", b.epoch, 1, [AllocateOp("t1", tuple(range(5)))])
    stats = [pool_stats(executor.executor_id, executor.pool) for executor in (a, b, c)]
    protos = [pool_stats_to_proto(pool) for pool in stats]
    assert total_of(protos) == pool_stats_to_proto(total_stats(stats))
    assert total_of(protos[:2]) == pool_stats_to_proto(total_stats(stats[:2]))
    assert total_of(protos[:2]).block_size == 4 and total_of(protos).block_size == 0
    assert total_of([]) == pool_stats_to_proto(total_stats([]))


# -- pagedctl against a group --------------------------------------------------------------------

def pagedctl(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagedserve.cli.pagedctl", "--target", target, *args],
        cwd=REPO_ROOT, env=hermetic_env(), capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def group():
    """Two shards, each with one pool that holds one sequence."""
    with Shards.start(2) as shards:
        for index, executor_id in enumerate(shards.executor_ids("ctl")):
            stub = pb_grpc.AllocatorStub(shards.client.channels[shards.addresses[index]])
            executor = register(stub, executor_id, num_blocks=8 * (index + 1), block_size=4)
            executor.step(allocate(f"seq-on-{index}", list(range(6 + index))))
        yield shards


def test_pagedctl_shows_the_group_as_one_allocator(group):
    a, b = group.executor_ids("ctl")
    stats = json.loads(pagedctl(group.target, "--json", "stats").stdout)
    assert [pool["executor_id"] for pool in stats["pools"]] == sorted([a, b])
    assert stats["total"]["num_blocks"] == 8 + 16
    assert stats["total"]["num_used_blocks"] == 2 + 2 and stats["total"]["num_sequences"] == 2
    executors = pagedctl(group.target, "executors").stdout
    for executor_id, shard in ((a, group.addresses[0]), (b, group.addresses[1])):
        row = next(line.split() for line in executors.splitlines()
                   if line.startswith(executor_id))
        assert row[-1] == shard, "the allocator column names each executor's shard"
    sequences = json.loads(pagedctl(group.target, "--json", "sequences").stdout)
    # In executor id order, as one allocator lists them (the ids, like the ports, vary).
    assert [(s["executor_id"], s["seq_id"]) for s in sequences["sequences"]] == sorted(
        [(a, "seq-on-0"), (b, "seq-on-1")])
    audit = pagedctl(group.target, "audit")
    assert audit.returncode == 0
    assert audit.stdout.strip() == "ok: 2 pools, 24 blocks, no violations"


def test_pagedctl_finds_the_shard_of_one_executor_or_sequence(group):
    a, b = group.executor_ids("ctl")
    table = json.loads(pagedctl(group.target, "--json", "table", "seq-on-1").stdout)
    assert table["executor_id"] == b and table["num_tokens"] == 7
    blocks = json.loads(pagedctl(group.target, "--json", "blocks", a).stdout)
    assert len(blocks["blocks"]) == 8
    one = json.loads(pagedctl(group.target, "--json", "stats", "--executor", b).stdout)
    assert [pool["executor_id"] for pool in one["pools"]] == [b]
    missing = pagedctl(group.target, "blocks", "no-such-executor")
    assert missing.returncode == 2 and "NOT_FOUND" in missing.stderr


def test_pagedctl_per_shard_shows_each_shards_own_answer(group):
    per_shard = json.loads(pagedctl(group.target, "--json", "stats", "--per-shard").stdout)
    assert list(per_shard["shards"]) == group.addresses
    assert [len(reply["pools"]) for reply in per_shard["shards"].values()] == [1, 1]
    audit = pagedctl(group.target, "audit", "--per-shard")
    assert audit.returncode == 0
    assert audit.stdout.split("\n\n") == [
        f"allocator {group.addresses[0]}:\nok: 1 pools, 8 blocks, no violations",
        f"allocator {group.addresses[1]}:\nok: 1 pools, 16 blocks, no violations\n"]


def test_pagedctl_names_the_shard_that_fails_and_reads_events_from_one_allocator(group):
    down = "127.0.0.1:1"      # nothing listens there
    failed = pagedctl(f"{group.addresses[0]},{down}", "--timeout", "2", "stats")
    assert failed.returncode == 2
    assert f"UNAVAILABLE: allocator shard {down}:" in failed.stderr
    events = pagedctl(group.target, "events")
    assert events.returncode == 2
    assert "events reads one allocator" in events.stderr
    assert pagedctl(group.addresses[0], "events").returncode == 0
    bad = pagedctl("a:1,a:1", "stats")
    assert bad.returncode == 2 and "allocator a:1 is listed twice" in bad.stderr
