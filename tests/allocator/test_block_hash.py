"""Block hashes follow their documented encoding, pinned to exact digests."""
from __future__ import annotations

from hashlib import blake2b

from allocator_service.core.block_hash import chain_hash, root_hash


def test_root_hash_matches_documented_encoding():
    # person "pagedserve-root", then each string as a little-endian u64 length and its bytes.
    encoded = b"\x02\0\0\0\0\0\0\0m1" + b"\x01\0\0\0\0\0\0\0t"
    expected = blake2b(encoded, digest_size=16, person=b"pagedserve-root").digest()
    assert root_hash("m1", "t") == expected
    assert root_hash("m1", "t").hex() == "81c0e0743e6229515d8fd0ca8918edcc"
    assert root_hash("m1", "t") == root_hash("m1", "t")


def test_chain_hash_matches_documented_encoding():
    parent = root_hash("m1", "t")
    packed = b"\x01\0\0\0\x02\0\0\0\x03\0\0\0\x04\0\0\0"
    assert chain_hash(parent, [1, 2, 3, 4]) == blake2b(parent + packed, digest_size=16).digest()
    assert chain_hash(parent, (1, 2, 3, 4)).hex() == "7fde6ed4be4a119a8ad38f8cf4262dc2"
    assert chain_hash(parent, [1, 2, 3, 4]) != chain_hash(parent, [1, 2, 4, 3])
    assert chain_hash(parent, [1, 2, 3, 4]) != chain_hash(root_hash("m1", ""), [1, 2, 3, 4])


def test_hashes_differ_with_salt_or_fingerprint():
    base = root_hash("m1", "")
    assert base.hex() == "698e078ea03b58f105517e6ffd5a9a0d"
    assert len({base, root_hash("m1", "t"), root_hash("m2", ""), root_hash("", "m1")}) == 4
    # The length prefix keeps the two fields apart.
    assert root_hash("ab", "c") != root_hash("a", "bc")
