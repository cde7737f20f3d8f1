"""The free list: a doubly linked list threaded through the pool's block records.

    head <-> b7 <-> b2 <-> ... <-> b4 <-> tail        (head and tail are sentinels)
             ^ taken first                ^ most recently freed cached block

Blocks that hold nothing reusable are pushed at the head, so they are taken first; blocks that
still hold a cached prefix are pushed at the tail, so the tail end is the least likely to be
evicted (LRU). A prefix-cache hit takes a block out of the middle in O(1).

The links are block ids in the PREV and NEXT items of each block's record (block.py); the
sentinels are records `num_blocks` and `num_blocks + 1` past the blocks' own.
"""
from __future__ import annotations

from collections.abc import Iterable

from librt.vecs import vec
from mypy_extensions import i64

from allocator_service.core.block import NEXT, NOT_LINKED, PREV, RECORD


class FreeBlockQueue:
    def __init__(self, records: vec[i64], num_blocks: i64, block_ids: Iterable[int]) -> None:
        """Links `block_ids` in this order; `records` holds num_blocks + 2 records, every
        block's links NOT_LINKED."""
        self._records = records
        self._head: i64 = num_blocks
        self._tail: i64 = num_blocks + 1
        records[self._head * RECORD + NEXT] = self._tail
        records[self._tail * RECORD + PREV] = self._head
        records[self._head * RECORD + PREV] = records[self._tail * RECORD + NEXT] = NOT_LINKED
        self.num_free: i64 = 0
        for block_id in block_ids:
            self.push_tail(i64(block_id))

    def pop_head(self) -> i64:
        """Removes and returns the block to take next; the caller checks num_free first."""
        block = self._records[self._head * RECORD + NEXT]
        assert block != self._tail, "pop from an empty free list"
        self.remove(block)
        return block

    def remove(self, block: i64) -> None:
        records = self._records
        at = block * RECORD
        prev, nxt = records[at + PREV], records[at + NEXT]
        assert prev != NOT_LINKED and nxt != NOT_LINKED, f"block {block} is not free"
        records[prev * RECORD + NEXT] = nxt
        records[nxt * RECORD + PREV] = prev
        records[at + PREV] = records[at + NEXT] = NOT_LINKED
        self.num_free -= 1

    def push_tail(self, block: i64) -> None:
        self._link(block, self._records[self._tail * RECORD + PREV], self._tail)

    def push_head(self, block: i64) -> None:
        self._link(block, self._head, self._records[self._head * RECORD + NEXT])

    def _link(self, block: i64, prev: i64, nxt: i64) -> None:
        records = self._records
        at = block * RECORD
        assert records[at + PREV] == NOT_LINKED and records[at + NEXT] == NOT_LINKED, (
            f"block {block} is already on the free list")
        records[at + PREV] = prev
        records[at + NEXT] = nxt
        records[prev * RECORD + NEXT] = block
        records[nxt * RECORD + PREV] = block
        self.num_free += 1

    def contains(self, block: int) -> bool:
        return self._records[i64(block) * RECORD + NEXT] != NOT_LINKED

    def block_ids(self) -> list[int]:
        """Head to tail: the order in which allocation takes the blocks."""
        records, ids = self._records, []
        block = records[self._head * RECORD + NEXT]
        while block != self._tail:
            ids.append(int(block))
            block = records[block * RECORD + NEXT]
        return ids
