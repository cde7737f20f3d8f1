"""The prefix index's open-addressing table answers as a dict would, through every way its
entries come and go: removals shift later entries back, probes cross full runs and wrap around
the table's end, and keys that share a home slot still find their own entry."""
from __future__ import annotations

import struct

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from allocator_service.core.block import Block, BlockId
from allocator_service.core.hash_index import HashIndex

NUM_BLOCKS = 12   # a table of 32 slots


def key(home: int, tag: int) -> bytes:
    """A 16-byte hash whose low bits (its home slot in a 32-slot table) are `home`; `tag`
    sets the high bits and the second half, so keys of one home differ."""
    return struct.pack("<qq", home + (tag << 5) - (1 << 62), tag * 7919 - 3)


# Few homes, near the table's end, so runs form and wrap around.
KEYS = [key(home, tag) for home in (0, 1, 29, 30, 31) for tag in range(5)]


class IndexAgainstDict(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = [Block(BlockId(i)) for i in range(NUM_BLOCKS)]
        self.index = HashIndex(self.blocks)
        self.model: dict[bytes, Block] = {}

    @precondition(lambda self: len(self.model) < NUM_BLOCKS)
    @rule(k=st.sampled_from(KEYS), block_id=st.integers(0, NUM_BLOCKS - 1))
    def setdefault(self, k: bytes, block_id: int) -> None:
        block = self.blocks[block_id]
        assert self.index.setdefault(k, block) is self.model.setdefault(k, block)

    @precondition(lambda self: len(self.model) < NUM_BLOCKS)
    @rule(k=st.sampled_from(KEYS), block_id=st.integers(0, NUM_BLOCKS - 1))
    def assign(self, k: bytes, block_id: int) -> None:
        self.index[k] = self.model[k] = self.blocks[block_id]

    @rule(k=st.sampled_from(KEYS))
    def delete(self, k: bytes) -> None:
        if k in self.model:
            del self.index[k]
            del self.model[k]
        else:
            with pytest.raises(KeyError):
                del self.index[k]

    @rule(k=st.sampled_from(KEYS), block_id=st.integers(0, NUM_BLOCKS - 1))
    def remove_entry(self, k: bytes, block_id: int) -> None:
        block = self.blocks[block_id]
        owned = self.model.get(k) is block
        assert self.index.remove_entry(k, block) == owned
        if owned:
            del self.model[k]

    @rule()
    def clear(self) -> None:
        self.index.clear()
        self.model.clear()

    @invariant()
    def answers_as_the_dict(self) -> None:
        assert len(self.index) == len(self.model)
        for k in KEYS:
            assert self.index.get(k) is self.model.get(k)
            assert (k in self.index) == (k in self.model)
        assert sorted((k, b.block_id) for k, b in self.index.items()) == sorted(
            (k, b.block_id) for k, b in self.model.items())
        assert sorted(self.index) == sorted(self.model)
        assert sorted(b.block_id for b in self.index.values()) == sorted(
            b.block_id for b in self.model.values())


TestIndexAgainstDict = IndexAgainstDict.TestCase
TestIndexAgainstDict.settings = settings(max_examples=200, stateful_step_count=60,
                                         deadline=None)


def test_a_hash_of_another_length_is_refused_by_name():
    index = HashIndex([Block(BlockId(0))])
    with pytest.raises(ValueError, match="a block hash is 16 bytes, got 4"):
        index.get(b"abcd")
    with pytest.raises(KeyError):
        index[bytes(16)]
    assert b"abcd" not in index and "a str" not in index


def test_the_table_has_at_least_twice_the_slots_of_the_pool():
    for num_blocks in (0, 1, 12, 1000):
        index = HashIndex([Block(BlockId(i)) for i in range(num_blocks)])
        slots = int(repr(index).split(" of ")[1].split()[0])
        assert slots >= 2 * num_blocks and slots & (slots - 1) == 0
