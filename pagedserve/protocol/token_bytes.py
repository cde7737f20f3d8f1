"""Token ids as bytes, 4 each, little-endian: the one packed form of a run of token ids.

The Step protocol carries ids so (`packed_token_ids`, as int32), and the allocator's block hash
covers them so (as uint32, allocator_service/core/block_hash.py); for the ids both accept, 0 to
2**31 - 1, the bytes are the same. An int32 array's own bytes are this form on a little-endian
machine, so packing is one copy; a big-endian machine swaps them first.
"""
from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

TOKEN_BYTES = 4
# An int32 array's own bytes are the packed form (no byte swap) on such a machine.
NATIVE_IS_LITTLE_ENDIAN = sys.byteorder == "little"


def array_to_bytes(token_ids: array[int]) -> bytes:
    """The packed form of an int32 array (it is not changed)."""
    if NATIVE_IS_LITTLE_ENDIAN:
        return token_ids.tobytes()
    swapped = array("i", token_ids)
    swapped.byteswap()
    return swapped.tobytes()


def ids_to_bytes(token_ids: Sequence[int]) -> bytes:
    """The packed form of any sequence of ids. Raises OverflowError for an id outside int32,
    as the proto's repeated int32 field would."""
    return array_to_bytes(array("i", token_ids))


def bytes_to_array(packed: bytes) -> array[int]:
    """The int32 array of a packed form whose length is a multiple of TOKEN_BYTES."""
    token_ids = array("i")
    token_ids.frombytes(packed)
    if not NATIVE_IS_LITTLE_ENDIAN:
        token_ids.byteswap()
    return token_ids
