"""The free list: a doubly linked list threaded through the Block objects.

    head <-> b7 <-> b2 <-> ... <-> b4 <-> tail        (head and tail are sentinels)
             ^ taken first                ^ most recently freed cached block

Blocks that hold nothing reusable are pushed at the head, so they are taken first; blocks that
still hold a cached prefix are pushed at the tail, so the tail end is the least likely to be
evicted (LRU). A prefix-cache hit takes a block out of the middle in O(1).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from allocator_service.core.block import Block, BlockId


class FreeBlockQueue:
    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(BlockId(-1))
        self._tail = Block(BlockId(-2))
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for block in blocks:
            self.push_tail(block)

    def unlink_all(self) -> None:
        """Undoes the links of a pool being dropped. The list is a chain of reference cycles:
        unlinked, its blocks are freed by reference counting alone, without the cyclic
        garbage collector (which the allocator keeps away from its pools, see
        allocator_service/server/heap.py)."""
        block: Block | None = self._head
        while block is not None:
            following = block.next_free
            block.prev_free = block.next_free = None
            block = following
        self.num_free = 0

    def pop_head(self) -> Block:
        """Removes and returns the block to take next; the caller checks num_free first."""
        block = self._head.next_free
        assert block is not self._tail and block is not None, "pop from an empty free list"
        self.remove(block)
        return block

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"block {block.block_id} is not free"
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def push_tail(self, block: Block) -> None:
        self._link(block, self._tail.prev_free, self._tail)

    def push_head(self, block: Block) -> None:
        self._link(block, self._head, self._head.next_free)

    def _link(self, block: Block, prev: Block | None, nxt: Block | None) -> None:
        assert block.prev_free is None and block.next_free is None, (
            f"block {block.block_id} is already on the free list")
        assert prev is not None and nxt is not None
        block.prev_free, block.next_free = prev, nxt
        prev.next_free = block
        nxt.prev_free = block
        self.num_free += 1

    @staticmethod
    def contains(block: Block) -> bool:
        return block.next_free is not None

    def __iter__(self) -> Iterator[Block]:
        """Head to tail: the order in which allocation takes the blocks."""
        block = self._head.next_free
        while block is not None and block is not self._tail:
            yield block
            block = block.next_free
