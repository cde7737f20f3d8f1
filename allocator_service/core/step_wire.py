"""A Step's request read from, and its answer written to, protobuf wire bytes without building
protobuf objects: the Step channel's path (compiled with the rest of the core).

Reading a StepRequest through protobuf builds a wrapper object for every op and field the
converter touches, and the retry identity needs the request serialized again; writing the
answer builds a message per result. Played in process on recorded fleet streams that was a
fifth of the allocator's time on a Step (docs/architecture.md). This module reads the form our
executor's client writes (every field once, in any order; token ids packed) and writes exactly
the bytes protobuf writes for the same answer.

Anything else a valid request may hold (unknown fields, a field given twice, which protobuf
merges, the repeated `token_ids`, ids past int32, varints of ten bytes, text that is not UTF-8)
or an invalid one makes `decode_step_request` return None: the caller parses it with protobuf
as before, which accepts or refuses it with the message it always gave. So this is only ever a
faster way to the same ops, never a second parser with opinions of its own.
"""
from __future__ import annotations

from array import array
from typing import Final

from librt.strings import BytesWriter

from pagedserve.protocol.block_ops import (OK, AllocateOp, AppendOp, BlockOp, ForkOp, FreeOp,
                                           OpResult, StepResult)
from pagedserve.protocol.token_bytes import NATIVE_IS_LITTLE_ENDIAN, TOKEN_BYTES

# The wire type (protobuf encoding) of a length-delimited run of bytes: strings, bytes, packed
# repeated numbers, embedded messages.
LEN: Final = 2
# Values this reader takes from a varint: up to 9 bytes (below 2**63). Longer ones (negative
# numbers are 10 bytes) go to protobuf, which knows how each field type truncates them.
MAX_VARINT_BYTES: Final = 9
INT32_LIMIT: Final = 1 << 31
# BlockOp's fields: the op kinds.
KIND_ALLOCATE: Final = 1
KIND_APPEND: Final = 2
KIND_FORK: Final = 3
KIND_FREE: Final = 4


class DecodedStep:
    """A Step's header and ops, and the bytes that identify it (its retry digest's input and
    its journal entry)."""

    def __init__(self, executor_id: str, epoch: int, step_id: int, ops: list[BlockOp],
                 body: bytes) -> None:
        self.executor_id = executor_id
        self.epoch = epoch
        self.step_id = step_id
        self.ops = ops
        self.body = body


class NotFast(Exception):
    """The bytes hold something this reader leaves to protobuf."""


class Reader:
    """A cursor over one message's bytes, data[pos:end]."""

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data = data
        self.pos = pos
        self.end = end
        self.seen = 0   # a bit per field number read so far

    def field_key(self, last_number: int) -> int:
        """The next field's key (number << 3 | wire type), for a field numbered 1 to
        `last_number` and not read before (a repeat is merged or overridden by protobuf)."""
        key = self.varint()
        number = key >> 3
        if number < 1 or number > last_number or self.seen & (1 << number):
            raise NotFast()
        self.seen |= 1 << number
        return key

    def more(self) -> bool:
        return self.pos < self.end

    def varint(self) -> int:
        data = self.data
        pos = self.pos
        value = 0
        shift = 0
        for _ in range(MAX_VARINT_BYTES):
            if pos >= self.end:
                raise NotFast()
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return value
            shift += 7
        raise NotFast()

    def tag(self, expected_wire_type: int) -> int:
        """The next field's number; its wire type must be the one the field has."""
        key = self.varint()
        if key & 7 != expected_wire_type:
            raise NotFast()
        return key >> 3

    def span(self) -> tuple[int, int]:
        """Where the length-delimited field that comes next lies, data[start:end]; this reader
        moves past it."""
        size = self.varint()
        start = self.pos
        if size > self.end - start:
            raise NotFast()
        self.pos = start + size
        return start, self.pos

    def blob(self) -> bytes:
        start, end = self.span()
        return self.data[start:end]

    def text(self) -> str:
        try:
            return self.blob().decode("utf-8")
        except UnicodeDecodeError:
            raise NotFast() from None

    def int32(self) -> int:
        value = self.varint()
        if value >= INT32_LIMIT:
            raise NotFast()
        return value

    def sub(self) -> Reader:
        """The embedded message that comes next; this reader moves past it."""
        start, end = self.span()
        return Reader(self.data, start, end)


def decode_step_request(body: bytes) -> DecodedStep | None:
    """The Step in these StepRequest bytes, or None where protobuf must read them."""
    try:
        return _decode(body)
    except NotFast:
        return None


def _decode(body: bytes) -> DecodedStep:
    reader = Reader(body, 0, len(body))
    executor_id = ""
    epoch = 0
    step_id = 0
    ops: list[BlockOp] = []
    while reader.more():
        if reader.data[reader.pos] == 0x22:   # 4 ops, repeated (a one-byte key)
            reader.pos += 1
            ops.append(_op(reader.sub()))
            continue
        key = reader.field_key(3)
        if key == 0x0A:                       # 1 executor_id
            executor_id = reader.text()
        elif key == 0x10:                     # 2 epoch
            epoch = reader.varint()
        elif key == 0x18:                     # 3 step_id
            step_id = reader.varint()
        else:
            raise NotFast()
    return DecodedStep(executor_id, epoch, step_id, ops, body)


def _op(reader: Reader) -> BlockOp:
    """One BlockOp: exactly one kind, given once."""
    kind = reader.tag(LEN)
    if kind == KIND_APPEND:
        op: BlockOp = _append(reader.sub())
    elif kind == KIND_ALLOCATE:
        op = _allocate(reader.sub())
    elif kind == KIND_FORK:
        op = _fork(reader.sub())
    elif kind == KIND_FREE:
        op = _free(reader.sub())
    else:
        raise NotFast()
    if reader.more():   # a second kind (the last one wins) or an unknown field
        raise NotFast()
    return op


def _packed_tokens(reader: Reader) -> object:
    packed = reader.blob()
    if not packed:
        return []   # what protobuf's path gives for no ids: the empty repeated field's list
    if len(packed) % TOKEN_BYTES:
        raise NotFast()   # protobuf's path refuses it, naming the op
    # token_bytes.bytes_to_array, written out: a call into an uncompiled module is dear here.
    token_ids = array("i")
    token_ids.frombytes(packed)
    if not NATIVE_IS_LITTLE_ENDIAN:
        token_ids.byteswap()
    return token_ids


def _append(reader: Reader) -> AppendOp:
    seq_id = ""
    token_ids: object = []
    lookahead_slots = 0
    num_computed_tokens = 0
    while reader.more():
        key = reader.field_key(5)
        if key == 0x0A:
            seq_id = reader.text()
        elif key == 0x18:
            lookahead_slots = reader.int32()
        elif key == 0x20:
            num_computed_tokens = reader.varint()
        elif key == 0x2A:
            token_ids = _packed_tokens(reader)
        else:
            raise NotFast()   # token_ids (2), or a field of the wrong wire type
    return AppendOp(seq_id, token_ids, lookahead_slots,  # type: ignore[arg-type]
                    num_computed_tokens)


def _allocate(reader: Reader) -> AllocateOp:
    seq_id = ""
    token_ids: object = []
    cache_salt = ""
    lookahead_slots = 0
    while reader.more():
        key = reader.field_key(5)
        if key == 0x0A:
            seq_id = reader.text()
        elif key == 0x1A:
            cache_salt = reader.text()
        elif key == 0x20:
            lookahead_slots = reader.int32()
        elif key == 0x2A:
            token_ids = _packed_tokens(reader)
        else:
            raise NotFast()
    return AllocateOp(seq_id, token_ids, cache_salt,  # type: ignore[arg-type]
                      lookahead_slots)


def _fork(reader: Reader) -> ForkOp:
    parent = ""
    child = ""
    while reader.more():
        key = reader.field_key(2)
        if key == 0x0A:
            parent = reader.text()
        elif key == 0x12:
            child = reader.text()
        else:
            raise NotFast()
    return ForkOp(parent, child)  # type: ignore[arg-type]


def _free(reader: Reader) -> FreeOp:
    seq_id = ""
    while reader.more():
        if reader.field_key(1) != 0x0A:
            raise NotFast()
        seq_id = reader.text()
    return FreeOp(seq_id)  # type: ignore[arg-type]


# -- the answer ----------------------------------------------------------------------------------
# Written into librt's BytesWriter, whose appends mypyc compiles into stores into a growing
# buffer: cheaper than the list of byte values turned into bytes once that it replaced, which in
# turn cost less than joined bytes (those cost more than protobuf).
# A nested message or packed field is preceded by its length, which is computed first
# (`_varint_size`) rather than by writing the body into a list of its own and copying it over:
# those lists, one or two per result, were about a tenth of writing an answer.

def _varint_size(value: int) -> int:
    """How many bytes _put_varint writes for `value`."""
    if value < 0:
        return 10
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _put_varint(out: BytesWriter, value: int) -> None:
    """A varint; a negative value as its 64-bit two's complement (ten bytes), as protobuf
    writes an int64."""
    if value < 0:
        value += 1 << 64
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _packed_size(values: list[int]) -> int:
    """The bytes of a packed field's values (its length prefix's value)."""
    size = 0
    for value in values:
        size += _varint_size(value)
    return size


def _put_packed(out: BytesWriter, tag: int, values: list[int], size: int) -> None:
    """A packed field whose values take `size` bytes (_packed_size)."""
    out.append(tag)
    _put_varint(out, size)
    for value in values:
        _put_varint(out, value)


def _copy_size(src: int, dst: int) -> int:
    """The bytes of a BlockCopy message (a zero field is not written)."""
    return ((1 + _varint_size(src)) if src else 0) + ((1 + _varint_size(dst)) if dst else 0)


def _put_result(out: BytesWriter, result: OpResult) -> None:
    status = int(result.status)
    text = result.message.encode("utf-8") if status and result.message else b""
    table_size = _packed_size(result.block_table)
    new_size = _packed_size(result.new_blocks)
    size = 0
    if status:
        size += 1 + _varint_size(status)
        if text:
            size += 1 + _varint_size(len(text)) + len(text)
    if result.block_table:
        size += 1 + _varint_size(table_size) + table_size
    if result.num_cached_tokens:
        size += 1 + _varint_size(result.num_cached_tokens)
    if result.new_blocks:
        size += 1 + _varint_size(new_size) + new_size
    for src, dst in result.copies:
        copy_size = _copy_size(src, dst)
        size += 1 + _varint_size(copy_size) + copy_size
    out.append(0x0A)
    _put_varint(out, size)
    if status:
        out.append(0x08)
        _put_varint(out, status)
        if text:
            out.append(0x12)
            _put_varint(out, len(text))
            out.write(text)
    if result.block_table:
        _put_packed(out, 0x1A, result.block_table, table_size)
    if result.num_cached_tokens:
        out.append(0x20)
        _put_varint(out, result.num_cached_tokens)
    if result.new_blocks:
        _put_packed(out, 0x2A, result.new_blocks, new_size)
    for src, dst in result.copies:
        out.append(0x32)
        _put_varint(out, _copy_size(src, dst))
        if src:
            out.append(0x08)
            _put_varint(out, src)
        if dst:
            out.append(0x10)
            _put_varint(out, dst)


def encode_step_response(result: StepResult) -> bytes:
    """The StepResponse of this result, byte for byte what protobuf serializes for it
    (pagedserve/protocol/block_codec.py's step_result_to_proto)."""
    out = BytesWriter()
    for op_result in result.results:
        if op_result is OK:   # most results of a decode Step: an Append that needed no block
            out.append(0x0A)
            out.append(0)
        else:
            _put_result(out, op_result)
    if result.replayed:
        out.append(0x10)
        out.append(1)
    if result.num_free_blocks:
        out.append(0x18)
        _put_varint(out, result.num_free_blocks)
    return out.getvalue()


# -- an answer read back ---------------------------------------------------------------------------

# A result as plain values: (status, message, block_table, num_cached_tokens, new_blocks, copies).
PackedResult = tuple[int, str, list[int], int, list[int], list[tuple[int, int]]]


def decode_step_response(data: bytes) -> tuple[int, list[PackedResult]]:
    """(num_free_blocks, each result as plain values) of StepResponse bytes that
    encode_step_response wrote: what the allocator keeps of a Step's answer for its retries
    (core/allocator.py's RecordedStep). Not a reader of anyone else's bytes."""
    reader = Reader(data, 0, len(data))
    num_free_blocks = 0
    results: list[PackedResult] = []
    while reader.more():
        key = reader.varint()
        if key == 0x0A:
            results.append(_result(reader.sub()))
        elif key == 0x18:
            num_free_blocks = reader.varint()
        elif key == 0x10:
            reader.varint()   # replayed: a recorded answer is never written with it
        else:
            raise ValueError(f"field key {key} in a recorded StepResponse")
    return num_free_blocks, results


def _result(reader: Reader) -> PackedResult:
    status = 0
    message = ""
    block_table: list[int] = []
    num_cached_tokens = 0
    new_blocks: list[int] = []
    copies: list[tuple[int, int]] = []
    while reader.more():
        key = reader.varint()
        if key == 0x08:
            status = reader.varint()
        elif key == 0x12:
            message = reader.text()
        elif key == 0x1A:
            block_table = _packed_ints(reader.sub())
        elif key == 0x20:
            num_cached_tokens = reader.varint()
        elif key == 0x2A:
            new_blocks = _packed_ints(reader.sub())
        elif key == 0x32:
            copies.append(_copy(reader.sub()))
        else:
            raise ValueError(f"field key {key} in a recorded OpResult")
    return status, message, block_table, num_cached_tokens, new_blocks, copies


def _packed_ints(reader: Reader) -> list[int]:
    values: list[int] = []
    while reader.more():
        values.append(reader.varint())
    return values


def _copy(reader: Reader) -> tuple[int, int]:
    src = 0
    dst = 0
    while reader.more():
        key = reader.varint()
        if key == 0x08:
            src = reader.varint()
        elif key == 0x10:
            dst = reader.varint()
        else:
            raise ValueError(f"field key {key} in a recorded BlockCopy")
    return src, dst
