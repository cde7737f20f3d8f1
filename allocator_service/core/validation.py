"""Request checks that run before anything applies, so bad input changes nothing."""
from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Final

from pagedserve.common.errors import InvalidArgument
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, BlockOp, ForkOp, FreeOp, InvalidOp
from pagedserve.protocol.limits import Limits

MAX_TOKEN_ID: Final = (1 << 31) - 1  # the proto carries token ids as int32
# Where an int32's sign sits among its 4 bytes.
_SIGN_BYTE: Final = 3 if sys.byteorder == "little" else 0


def validate_registration(limits: Limits, executor_id: str, address: str, num_blocks: int,
                          block_size: int, executor_index: int | None = None) -> None:
    _check_id(limits, "executor_id", executor_id)
    if executor_index is not None and executor_index < 0:
        raise InvalidArgument(f"executor_index must be 0 or more (leave it unset for an "
                              f"executor without a number), got {executor_index}")
    if len(address) > limits.max_id_length:
        raise InvalidArgument(f"address is {len(address)} characters; the limit is "
                              f"{limits.max_id_length}")
    if not 1 <= num_blocks <= limits.max_num_blocks:
        raise InvalidArgument(f"num_blocks must be between 1 and {limits.max_num_blocks}, "
                              f"got {num_blocks}")
    if not 1 <= block_size <= limits.max_block_size:
        raise InvalidArgument(f"block_size must be between 1 and {limits.max_block_size}, "
                              f"got {block_size}")
    if num_blocks * block_size > limits.max_pool_slots:
        raise InvalidArgument(
            f"num_blocks × block_size must be at most {limits.max_pool_slots} token slots, got "
            f"{num_blocks} × {block_size} = {num_blocks * block_size}; at block_size "
            f"{block_size} a pool may have {limits.max_blocks_of(block_size)} blocks")


def validate_ops(limits: Limits, ops: Sequence[BlockOp]) -> None:
    """Raises InvalidOp naming the first malformed op (by index) and what is wrong with it."""
    if len(ops) > limits.max_ops_per_step:
        raise InvalidOp(f"a step carries at most {limits.max_ops_per_step} ops, got {len(ops)}")
    max_id, max_lookahead = limits.max_id_length, limits.max_lookahead_slots
    for index, op in enumerate(ops):
        # Decode appends are nearly every op: one inline test, the messages only on failure.
        if (type(op) is AppendOp and 0 < len(op.seq_id) <= max_id
                and 0 <= op.lookahead_slots <= max_lookahead and op.num_computed_tokens >= 0
                and token_ids_in_range(op.token_ids)):
            continue
        try:
            _validate_op(limits, op)
        except InvalidArgument as error:
            raise InvalidOp(f"ops[{index}] ({type(op).__name__}): {error}") from None


def validate_prompt(limits: Limits, token_ids: Sequence[int], cache_salt: str) -> None:
    """A prompt as Allocate and MatchPrefix take it."""
    if not token_ids:
        raise InvalidArgument("token_ids is empty; a prompt has at least one token")
    _check_tokens(token_ids)
    if len(cache_salt) > limits.max_id_length:
        raise InvalidArgument(f"cache_salt is longer than {limits.max_id_length} characters")


def _validate_op(limits: Limits, op: BlockOp) -> None:
    if isinstance(op, AppendOp):
        _check_id(limits, "seq_id", op.seq_id)
        _check_tokens(op.token_ids)
        _check_lookahead(limits, op.lookahead_slots)
        if op.num_computed_tokens < 0:
            raise InvalidArgument(f"num_computed_tokens must not be negative, got "
                                  f"{op.num_computed_tokens}")
    elif isinstance(op, AllocateOp):
        _check_id(limits, "seq_id", op.seq_id)
        validate_prompt(limits, op.token_ids, op.cache_salt)
        _check_lookahead(limits, op.lookahead_slots)
    elif isinstance(op, ForkOp):
        _check_id(limits, "parent_seq_id", op.parent_seq_id)
        _check_id(limits, "child_seq_id", op.child_seq_id)
        if op.parent_seq_id == op.child_seq_id:
            raise InvalidArgument("parent_seq_id and child_seq_id are the same")
    elif isinstance(op, FreeOp):
        _check_id(limits, "seq_id", op.seq_id)
    else:
        raise InvalidArgument("the op sets no kind (allocate, append, fork or free)")


def _check_id(limits: Limits, name: str, value: str) -> None:
    if not value:
        raise InvalidArgument(f"{name} is empty")
    if len(value) > limits.max_id_length:
        raise InvalidArgument(f"{name} is {len(value)} characters; the limit is "
                              f"{limits.max_id_length}")


def token_ids_in_range(token_ids: Sequence[int]) -> bool:
    """Whether every id is within 0 to 2**31 - 1 (the proto's int32, not negative)."""
    if type(token_ids) is array and token_ids.itemsize == 4 and token_ids.typecode == "i":
        # The decoder's int32 array (packed ids) holds nothing above 2**31 - 1, and a negative
        # id is one whose sign byte has its top bit set: the sign bytes must all be ASCII.
        # isascii() tests them in C, 8 at a time, with no int object per token (max() over
        # them took 13 times as long for a 1,000-token prompt, min() over the ids 20 times).
        return token_ids.tobytes()[_SIGN_BYTE::4].isascii()
    return not token_ids or (min(token_ids) >= 0 and max(token_ids) <= MAX_TOKEN_ID)


def _check_tokens(token_ids: Sequence[int]) -> None:
    if token_ids_in_range(token_ids):
        return
    if min(token_ids) < 0:
        raise InvalidArgument(f"token ids must not be negative, got {min(token_ids)}")
    if max(token_ids) > MAX_TOKEN_ID:
        raise InvalidArgument(f"token ids must be at most {MAX_TOKEN_ID}, got {max(token_ids)}")


def _check_lookahead(limits: Limits, lookahead_slots: int) -> None:
    if not 0 <= lookahead_slots <= limits.max_lookahead_slots:
        raise InvalidArgument(f"lookahead_slots must be between 0 and "
                              f"{limits.max_lookahead_slots}, got {lookahead_slots}")
