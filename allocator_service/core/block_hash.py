"""Chained content hashes of full blocks: the identity of a cached prefix.

    root  = H("root", model_fingerprint, cache_salt)
    h_0   = H(root, tokens of block 0)
    h_i   = H(h_{i-1}, tokens of block i)

The encoding is canonical (length-prefixed strings, tokens as little-endian uint32) and the hash
is BLAKE2b-128, so every process computes the same value for the same prefix, today and after a
restart; external routers that follow the KV events can recompute it.

The pools keep a cached block's tokens in that encoding too (`PackedTokens`): one bytes object
per block instead of a tuple of ints, cut from a sequence's int32 array without unboxing a token,
hashed as it is, compared with one memcmp on a prefix hit, and never walked by the collector.
"""
from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from hashlib import blake2b
from typing import Final, NewType

from pagedserve.protocol.token_bytes import (NATIVE_IS_LITTLE_ENDIAN, array_to_bytes,
                                             bytes_to_array, ids_to_bytes)

BlockHash = NewType("BlockHash", bytes)
HASH_BYTES: Final = 16

# A full block's token ids as the hash covers them: little-endian uint32, TOKEN_BYTES a token
# (pagedserve/protocol/token_bytes.py).
PackedTokens = NewType("PackedTokens", bytes)

# A hash function over (parent hash, the block's packed tokens); injectable so tests can force
# collisions.
HashFn = Callable[[BlockHash, PackedTokens], BlockHash]


def root_hash(model_fingerprint: str, cache_salt: str) -> BlockHash:
    """The parent hash of a sequence's first block: model and tenant partition the cache."""
    digest = blake2b(digest_size=HASH_BYTES, person=b"pagedserve-root")
    for part in (model_fingerprint, cache_salt):
        encoded = part.encode()
        digest.update(struct.pack("<Q", len(encoded)))
        digest.update(encoded)
    return BlockHash(digest.digest())


# A hasher with nothing fed to it, copied for each block: a copy skips parsing the
# constructor's keyword arguments, a quarter of hashing a block.
_UNFED: Final = blake2b(digest_size=HASH_BYTES)


def hash_packed(parent: BlockHash, tokens: PackedTokens) -> BlockHash:
    """Hash of a full block given its parent's hash and its packed tokens (the pools' HashFn)."""
    hasher = _UNFED.copy()
    hasher.update(parent)
    hasher.update(tokens)
    return BlockHash(hasher.digest())


def chain_hash(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """Hash of a full block given its parent's hash; tokens must be non-negative int32 values."""
    return hash_packed(parent, pack_tokens(token_ids))


def pack_tokens(token_ids: Sequence[int]) -> PackedTokens:
    return PackedTokens(ids_to_bytes(token_ids))


def unpack_tokens(tokens: PackedTokens) -> tuple[int, ...]:
    return tuple(bytes_to_array(tokens))


def packed_slice(token_ids: array[int], start: int, stop: int) -> PackedTokens:
    """The packed tokens [start, stop) of an int32 array (a sequence's tokens; valid ids are
    non-negative, so their int32 bytes are the hash's uint32 ones)."""
    if NATIVE_IS_LITTLE_ENDIAN:  # the array's bytes as they are: no call into token_bytes
        return PackedTokens(token_ids[start:stop].tobytes())
    return PackedTokens(array_to_bytes(token_ids[start:stop]))
