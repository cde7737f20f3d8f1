"""Chained content hashes of full blocks: the identity of a cached prefix.

    root  = H("root", model_fingerprint, cache_salt)
    h_0   = H(root, tokens of block 0)
    h_i   = H(h_{i-1}, tokens of block i)

The encoding is canonical (length-prefixed strings, tokens as little-endian uint32) and the hash
is BLAKE2b-128, so every process computes the same value for the same prefix, today and after a
restart; external routers that follow the KV events can recompute it.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from hashlib import blake2b
from typing import NewType

BlockHash = NewType("BlockHash", bytes)
HASH_BYTES = 16

# A hash function over (parent hash, the block's tokens); injectable so tests can force collisions.
HashFn = Callable[[BlockHash, Sequence[int]], BlockHash]


def root_hash(model_fingerprint: str, cache_salt: str) -> BlockHash:
    """The parent hash of a sequence's first block: model and tenant partition the cache."""
    digest = blake2b(digest_size=HASH_BYTES, person=b"pagedserve-root")
    for part in (model_fingerprint, cache_salt):
        encoded = part.encode()
        digest.update(struct.pack("<Q", len(encoded)))
        digest.update(encoded)
    return BlockHash(digest.digest())


def chain_hash(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """Hash of a full block given its parent's hash; tokens must be non-negative int32 values."""
    packer = _PACKERS.get(len(token_ids)) or _packer(len(token_ids))
    return BlockHash(blake2b(parent + packer.pack(*token_ids), digest_size=HASH_BYTES).digest())


# One compiled format per block length (a pool hashes millions of blocks of one size).
_PACKERS: dict[int, struct.Struct] = {}


def _packer(num_tokens: int) -> struct.Struct:
    packer = _PACKERS[num_tokens] = struct.Struct(f"<{num_tokens}I")
    return packer
