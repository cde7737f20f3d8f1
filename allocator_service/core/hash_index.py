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

Values are block ids. Besides the probes the pool makes with a hash's two halves, the index
keeps a dict's reading surface (`get`, `[]`, `in`, `len`, `items()`, `values()`, iteration) for
readers (audit, inspection, snapshots, tests); the order of iteration is the table's, not
insertion order.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from librt.strings import BytesWriter, read_i64_le, write_i64_le
from librt.vecs import vec
from mypy_extensions import i64

from allocator_service.core.block_hash import HASH_BYTES, BlockHash

# Items per slot: the hash's low and high 8 bytes, and the block id + 1 (0: an empty slot).
SLOT: Final[i64] = 3
# What a probe answers for a hash the index does not hold.
ABSENT: Final[i64] = -1


def hash_lo(block_hash: BlockHash) -> i64:
    """The low half of a 16-byte hash, as the index and the block records keep it."""
    return read_i64_le(block_hash, 0)


def hash_hi(block_hash: BlockHash) -> i64:
    return read_i64_le(block_hash, 8)


def hash_bytes(lo: i64, hi: i64) -> BlockHash:
    """The 16-byte hash whose halves are `lo` and `hi`."""
    key = BytesWriter()
    write_i64_le(key, lo)
    write_i64_le(key, hi)
    return BlockHash(key.getvalue())


class HashIndex:
    def __init__(self, num_blocks: int) -> None:
        capacity: i64 = 8
        while capacity < 2 * num_blocks:
            capacity *= 2
        self._mask: i64 = capacity - 1
        self._slots: vec[i64] = vec[i64]([0] * (capacity * SLOT))
        self._size = 0

    # -- the probes the pool makes -------------------------------------------------------------

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

    def find(self, lo: i64, hi: i64) -> i64:
        """The block entered under this hash, or ABSENT."""
        slot = self._find(lo, hi)
        return self._slots[slot * SLOT + 2] - 1 if slot >= 0 else ABSENT

    def enter(self, lo: i64, hi: i64, block_id: i64) -> i64:
        """The block entered under this hash, entering `block_id` if there is none."""
        slot = self._find(lo, hi)
        if slot >= 0:
            return self._slots[slot * SLOT + 2] - 1
        self._put(-1 - slot, lo, hi, block_id)
        return block_id

    def replace(self, lo: i64, hi: i64, block_id: i64) -> None:
        """Enters `block_id` under this hash, in place of the block entered there if any."""
        slot = self._find(lo, hi)
        if slot >= 0:
            self._slots[slot * SLOT + 2] = block_id + 1
        else:
            self._put(-1 - slot, lo, hi, block_id)

    def remove_entry(self, lo: i64, hi: i64, block_id: i64) -> bool:
        """Removes the hash's entry if it is `block_id`'s; whether it was (one probe)."""
        slot = self._find(lo, hi)
        if slot < 0 or self._slots[slot * SLOT + 2] != block_id + 1:
            return False
        self._remove(slot)
        return True

    # -- a dict's reading surface, for readers -------------------------------------------------

    def _slot_of(self, block_hash: BlockHash) -> i64:
        if len(block_hash) != HASH_BYTES:
            raise ValueError(f"a block hash is {HASH_BYTES} bytes, got {len(block_hash)}")
        return self._find(hash_lo(block_hash), hash_hi(block_hash))

    def get(self, block_hash: BlockHash) -> int | None:
        slot = self._slot_of(block_hash)
        return int(self._slots[slot * SLOT + 2] - 1) if slot >= 0 else None

    def __getitem__(self, block_hash: BlockHash) -> int:
        block_id = self.get(block_hash)
        if block_id is None:
            raise KeyError(block_hash)
        return block_id

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

    def items(self) -> list[tuple[BlockHash, int]]:
        slots = self._slots
        return [(hash_bytes(slots[at], slots[at + 1]), int(slots[at + 2] - 1))
                for at in range(0, len(slots), SLOT) if slots[at + 2]]

    def keys(self) -> list[BlockHash]:
        return [key for key, _ in self.items()]

    def values(self) -> list[int]:
        slots = self._slots
        return [int(slots[at + 2] - 1) for at in range(0, len(slots), SLOT) if slots[at + 2]]

    def __iter__(self) -> Iterator[BlockHash]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"HashIndex({len(self)} of {self._mask + 1} slots)"

    # -- entering and removing -----------------------------------------------------------------

    def _put(self, slot: i64, lo: i64, hi: i64, block_id: i64) -> None:
        at = slot * SLOT
        slots = self._slots
        slots[at] = lo
        slots[at + 1] = hi
        slots[at + 2] = block_id + 1
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
