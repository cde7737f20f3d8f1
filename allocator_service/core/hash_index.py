"""A pool's prefix-cache index: block hash -> block, as an open-addressing table in flat arrays.

    slots (one vec[i64], three items a slot):  [lo, hi, block_id + 1] [lo, hi, 0] ...
                                                 ^ a hash's 16 bytes as two ints; 0: empty

A dict did this before. At fleet scale every block's life goes through the index twice (its old
prefix evicted when it is taken, its new one entered when it fills), always for a hash last
seen tens of seconds ago: a dict probe reads its index array, then its entries array, then the
key object to compare, each in memory long gone cold, and a dict whose entries come and go
rebuilds itself whole every few thousand insertions (a pause of milliseconds for a pool of
24,576 blocks). Here a probe reads one slot, the key inline, and the neighbours it may go on to
share its cache line; the table has twice the slots the pool has blocks, so it never grows,
and a removal shifts the slots after it back (no tombstones), so it never needs a rebuild.
The arrays are librt vecs: compiled by mypyc, reading and writing an item is a load or a store.

Values are the pool's Block objects, found by id. The index keeps the dict's reading surface
(`get`, `[]`, `in`, `len`, `items()`, `values()`, iteration), so readers (audit, inspection,
snapshots, tests) did not change; the order of iteration is the table's, not insertion order.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from librt.strings import BytesWriter, read_i64_le, write_i64_le
from librt.vecs import vec
from mypy_extensions import i64

from allocator_service.core.block import Block
from allocator_service.core.block_hash import HASH_BYTES, BlockHash

# Items per slot: the hash's low and high 8 bytes, and the block id + 1 (0: an empty slot).
SLOT: Final[i64] = 3


class HashIndex:
    def __init__(self, blocks: list[Block]) -> None:
        self._blocks = blocks
        capacity: i64 = 8
        while capacity < 2 * len(blocks):
            capacity *= 2
        self._mask: i64 = capacity - 1
        self._slots: vec[i64] = vec[i64]([0] * (capacity * SLOT))
        self._size = 0

    # -- the probe ---------------------------------------------------------------------------

    def _find(self, lo: i64, hi: i64) -> i64:
        """The slot holding this hash, or the empty slot where it would go (a negative number:
        -1 - slot)."""
        slots, mask = self._slots, self._mask
        slot = lo & mask
        while True:
            at = slot * SLOT
            if slots[at + 2] == 0:
                return -1 - slot
            if slots[at] == lo and slots[at + 1] == hi:
                return slot
            slot = (slot + 1) & mask

    def _slot_of(self, block_hash: BlockHash) -> i64:
        if len(block_hash) != HASH_BYTES:
            raise ValueError(f"a block hash is {HASH_BYTES} bytes, got {len(block_hash)}")
        return self._find(read_i64_le(block_hash, 0), read_i64_le(block_hash, 8))

    def _block_at(self, slot: i64) -> Block:
        return self._blocks[self._slots[slot * SLOT + 2] - 1]

    # -- the dict's surface --------------------------------------------------------------------

    def get(self, block_hash: BlockHash) -> Block | None:
        slot = self._slot_of(block_hash)
        return self._block_at(slot) if slot >= 0 else None

    def setdefault(self, block_hash: BlockHash, block: Block) -> Block:
        """The block entered under this hash, entering `block` if there is none."""
        slot = self._slot_of(block_hash)
        if slot >= 0:
            return self._block_at(slot)
        self._put(-1 - slot, block_hash, block)
        return block

    def __getitem__(self, block_hash: BlockHash) -> Block:
        block = self.get(block_hash)
        if block is None:
            raise KeyError(block_hash)
        return block

    def __setitem__(self, block_hash: BlockHash, block: Block) -> None:
        slot = self._slot_of(block_hash)
        if slot >= 0:
            self._slots[slot * SLOT + 2] = block.block_id + 1
        else:
            self._put(-1 - slot, block_hash, block)

    def __delitem__(self, block_hash: BlockHash) -> None:
        slot = self._slot_of(block_hash)
        if slot < 0:
            raise KeyError(block_hash)
        self._remove(slot)

    def remove_entry(self, block_hash: BlockHash, block: Block) -> bool:
        """Removes the hash's entry if it is `block`'s; whether it was (one probe)."""
        slot = self._slot_of(block_hash)
        if slot < 0 or self._slots[slot * SLOT + 2] != block.block_id + 1:
            return False
        self._remove(slot)
        return True

    def __contains__(self, block_hash: object) -> bool:
        # A key of another length is not in the index (as with a dict), rather than refused.
        return (isinstance(block_hash, bytes) and len(block_hash) == HASH_BYTES
                and self._slot_of(BlockHash(block_hash)) >= 0)

    def __len__(self) -> int:
        return self._size

    def clear(self) -> None:
        slots = self._slots
        for at in range(0, len(slots), SLOT):
            slots[at] = slots[at + 1] = slots[at + 2] = 0
        self._size = 0

    def items(self) -> list[tuple[BlockHash, Block]]:
        found: list[tuple[BlockHash, Block]] = []
        slots = self._slots
        for at in range(0, len(slots), SLOT):
            if slots[at + 2]:
                key = BytesWriter()
                write_i64_le(key, slots[at])
                write_i64_le(key, slots[at + 1])
                found.append((BlockHash(key.getvalue()), self._blocks[slots[at + 2] - 1]))
        return found

    def keys(self) -> list[BlockHash]:
        return [key for key, _ in self.items()]

    def values(self) -> list[Block]:
        slots = self._slots
        return [self._blocks[slots[at + 2] - 1] for at in range(0, len(slots), SLOT)
                if slots[at + 2]]

    def __iter__(self) -> Iterator[BlockHash]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"HashIndex({len(self)} of {self._mask + 1} slots)"

    # -- entering and removing -----------------------------------------------------------------

    def _put(self, slot: i64, block_hash: BlockHash, block: Block) -> None:
        at = slot * SLOT
        slots = self._slots
        slots[at] = read_i64_le(block_hash, 0)
        slots[at + 1] = read_i64_le(block_hash, 8)
        slots[at + 2] = block.block_id + 1
        self._size += 1

    def _remove(self, slot: i64) -> None:
        """Empties the slot, then moves back each entry after it (up to an empty slot) whose
        home slot is not between the hole and it, so no probe ever crosses an empty slot that
        its hash's entry lies beyond (backward-shift deletion)."""
        slots, mask = self._slots, self._mask
        hole = slot
        following = (slot + 1) & mask
        while slots[following * SLOT + 2] != 0:
            home = slots[following * SLOT] & mask
            # The entry may move to the hole unless its home lies cyclically in (hole, following].
            if ((following - home) & mask) >= ((following - hole) & mask):
                to, frm = hole * SLOT, following * SLOT
                slots[to] = slots[frm]
                slots[to + 1] = slots[frm + 1]
                slots[to + 2] = slots[frm + 2]
                hole = following
            following = (following + 1) & mask
        at = hole * SLOT
        slots[at] = slots[at + 1] = slots[at + 2] = 0
        self._size -= 1
