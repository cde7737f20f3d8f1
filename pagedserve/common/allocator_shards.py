"""Which allocator of a group owns an executor's pool: rendezvous hashing of executor ids.

An allocator group is a list of allocator addresses, `--allocator HOST:PORT,HOST:PORT,...`,
written the same way for every executor and gateway. Pools are independent of each other, so
each executor registers with one allocator of the list, its shard: the address that ranks
highest for its id. Every executor works this out alone, with nothing shared but the list:

- adding a shard moves only the executors that now rank the new one highest (about 1/S of
  them), and removing one moves only its own executors;
- the order of the list does not matter.

The gateway and pagedctl do not need the assignment: they ask every shard (allocator_group.py).
The rank is a hash of the address as written, so `allocator-1:50052` and `10.0.0.7:50052` are
two different shards even when they name the same process.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence


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
    """The shard that owns `executor_id`'s pool."""
    if not shards:
        raise ValueError("an allocator group needs at least one allocator")
    # The address breaks a tie between equal ranks, so the owner never depends on list order.
    return max(shards, key=lambda shard: (shard_rank(shard, executor_id), shard))
