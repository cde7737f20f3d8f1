"""Which allocator of a group owns an executor's pool: rendezvous hashing, by the executor's
index in its fleet when it has one and by its id when not.

An allocator group is a list of allocator addresses, `--allocator HOST:PORT,HOST:PORT,...`,
written the same way for every executor and gateway. Pools are independent of each other, so
each executor registers with one allocator of the list, its shard. Every executor works this
out alone, with nothing shared but the list, and the order of the list does not matter.

- **By id** (plain rendezvous hashing): the shard whose address ranks highest for the id.
  Adding a shard moves only the executors that now rank the new one highest (about 1/S of
  them), and removing one moves only its own. But the shards' shares are a random draw: at a
  few dozen executors per shard the busiest typically holds 10-20 % more than the mean, and
  a group is full when its busiest shard is.
- **By index** (`--executor-index K`, as `pagedserve up` numbers its executors; a
  StatefulSet's pod ordinal is one): executors 0, 1, 2, ... are placed in turn,
  each on the highest-ranked shard still under a bound just above an even share of the
  executors placed so far (consistent hashing with bounded loads, Mirrokni, Thorup and
  Zadimoghaddam, 2018). Every fleet of the first n indexes is then within LOAD_BOUND of even,
  and a small one exactly even, whatever the addresses; an executor's shard depends only on
  its index and the list, so executors may start, stop and leave in any order. The price is
  in moves: adding a fifth shard to four moves about 30 % of 400 pools, where 20 % must
  (tests pin it).

The gateway and pagedctl do not need the assignment: they ask every shard (allocator_group.py).
The rank is a hash of the address as written, so `allocator-1:50052` and `10.0.0.7:50052` are
two different shards even when they name the same process.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from fractions import Fraction

# How far above an even share an indexed executor's shard may be: the busiest shard of a group
# holds at most LOAD_BOUND × n / S of its first n executors (or n / S rounded up, when more).
# Lower evens the shards out further and moves more pools when a shard is added: at 400
# executors, 4 → 5 shards moves about 29 % of them at 1.1 and 35 % at 1.05.
LOAD_BOUND = Fraction(11, 10)


def parse_allocator_group(text: str) -> tuple[str, ...]:
    """The shards of `text` (one HOST:PORT, or several separated by commas), in order; raises
    ValueError naming what is wrong."""
    shards = tuple(part.strip() for part in text.split(","))
    if not text.strip() or any(not shard for shard in shards):
        raise ValueError(f"an allocator address is empty in {text!r}: give HOST:PORT, or "
                         f"HOST:PORT,HOST:PORT,... for an allocator group")
    for shard in shards:
        host, _, port = shard.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"allocator address {shard!r} is not HOST:PORT")
    duplicates = sorted({shard for shard in shards if shards.count(shard) > 1})
    if duplicates:
        raise ValueError(f"allocator {', '.join(duplicates)} is listed twice in {text!r}")
    return shards


def shard_rank(shard: str, executor_id: str) -> bytes:
    """How strongly `shard` claims `executor_id`: the highest claim wins. A keyed hash of both,
    the same in every process and on every machine (Python's hash() is salted per process)."""
    # The NUL cannot occur in an address, so no two (shard, id) pairs hash the same text.
    return hashlib.blake2b(f"{shard}\0{executor_id}".encode(), digest_size=8,
                           person=b"pagedserve-shard").digest()


def shard_of(executor_id: str, shards: Sequence[str]) -> str:
    """The shard that owns the pool of an executor with no index."""
    if not shards:
        raise ValueError("an allocator group needs at least one allocator")
    # The address breaks a tie between equal ranks, so the owner never depends on list order.
    return max(shards, key=lambda shard: (shard_rank(shard, executor_id), shard))


def balanced_owners(count: int, shards: Sequence[str]) -> list[str]:
    """The shards that own the pools of executors with indexes 0 .. count-1, in index order:
    each index, in turn, goes to the highest-ranked shard holding fewer of the indexes before
    it than the bound for index + 1 executors. One always does: together they hold `index`,
    fewer than S times the bound."""
    if not shards:
        raise ValueError("an allocator group needs at least one allocator")
    held = dict.fromkeys(shards, 0)
    owners = []
    for index in range(count):
        placed = index + 1
        # An even share rounded up keeps a small fleet exactly even; LOAD_BOUND (rounded down,
        # in exact fractions) gives a large one room to follow the ranks.
        bound = max(-(-placed // len(shards)), math.floor(LOAD_BOUND * placed / len(shards)))
        # The key is the index, not the id: a fleet's balance cannot depend on its names.
        owner = max((shard for shard in shards if held[shard] < bound),
                    key=lambda shard: (shard_rank(shard, f"#{index}"), shard))
        held[owner] += 1
        owners.append(owner)
    return owners


def executor_shard(executor_id: str, index: int | None, shards: Sequence[str]) -> str:
    """The shard an executor registers with: by its index when it has one (None: by its id)."""
    if index is None:
        return shard_of(executor_id, shards)
    if index < 0:
        raise ValueError(f"an executor index is 0 or more, not {index}")
    return balanced_owners(index + 1, shards)[index]
