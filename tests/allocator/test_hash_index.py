"""The prefix index's open-addressing table answers as a dict would, through every way its
entries come and go: removals shift later entries back, probes cross full runs and wrap around
the table's end, and keys that share a home slot still find their own entry."""
from __future__ import annotations

import struct

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from allocator_service.core.hash_index import ABSENT, HashIndex, hash_hi, hash_lo

NUM_BLOCKS = 12   # a table of 32 slots


def key(home: int, tag: int) -> bytes:
    """A 16-byte hash whose low bits (its home slot in a 32-slot table) are `home`; `tag`
    sets the high bits and the second half, so keys of one home differ."""
    return struct.pack("<qq", home + (tag << 5) - (1 << 62), tag * 7919 - 3)


# Few homes, near the table's end, so runs form and wrap around.
KEYS = [key(home, tag) for home in (0, 1, 29, 30, 31) for tag in range(5)]


def halves(k: bytes) -> tuple[int, int]:
    return hash_lo(k), hash_hi(k)


class IndexAgainstDict(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = HashIndex(NUM_BLOCKS)
        self.model: dict[bytes, int] = {}

    @precondition(lambda self: len(self.model) < NUM_BLOCKS)
    @rule(k=st.sampled_from(KEYS), block_id=st.integers(0, NUM_BLOCKS - 1))
    def enter(self, k: bytes, block_id: int) -> None:
        assert self.index.enter(*halves(k), block_id) == self.model.setdefault(k, block_id)

    @precondition(lambda self: len(self.model) < NUM_BLOCKS)
    @rule(k=st.sampled_from(KEYS), block_id=st.integers(0, NUM_BLOCKS - 1))
    def replace(self, k: bytes, block_id: int) -> None:
        self.index.replace(*halves(k), block_id)
        self.model[k] = block_id

    @rule(k=st.sampled_from(KEYS), block_id=st.integers(0, NUM_BLOCKS - 1))
    def remove_entry(self, k: bytes, block_id: int) -> None:
        owned = self.model.get(k) == block_id
        assert self.index.remove_entry(*halves(k), block_id) == owned
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
            assert self.index.get(k) == self.model.get(k)
            assert self.index.find(*halves(k)) == self.model.get(k, ABSENT)
            assert (k in self.index) == (k in self.model)
        assert sorted(self.index.items()) == sorted(self.model.items())
        assert sorted(self.index) == sorted(self.model)
        assert sorted(self.index.values()) == sorted(self.model.values())


TestIndexAgainstDict = IndexAgainstDict.TestCase
TestIndexAgainstDict.settings = settings(max_examples=200, stateful_step_count=60,
                                         deadline=None)


def test_a_hash_of_another_length_is_refused_by_name():
    index = HashIndex(1)
    with pytest.raises(ValueError, match="a block hash is 16 bytes, got 4"):
        index.get(b"abcd")
    with pytest.raises(KeyError):
        index[bytes(16)]
    assert b"abcd" not in index and "a str" not in index


def test_the_table_has_at_least_twice_the_slots_of_the_pool():
    for num_blocks in (0, 1, 12, 1000):
        index = HashIndex(num_blocks)
        slots = int(repr(index).split(" of ")[1].split()[0])
        assert slots >= 2 * num_blocks and slots & (slots - 1) == 0
