"""The Step channel's wire reader and writer (allocator_service/core/step_wire.py) against
protobuf's path (pagedserve/protocol/block_codec.py): the reader gives the same ops or steps
aside (None), never different ops and never ops where protobuf refuses the bytes; the writer gives
protobuf's bytes."""
from __future__ import annotations

from array import array

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator_service.core.step_wire import (decode_step_request, decode_step_response,
                                             encode_step_response)
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.protocol.block_codec import op_to_proto, ops_from_proto, step_result_to_proto
from pagedserve.protocol.block_ops import (AllocateOp, AppendOp, BlockOp, ForkOp, FreeOp,
                                           OpResult, OpStatus, StepResult)

ids = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
tokens = st.lists(st.integers(0, 2**31 - 1), max_size=40)
small = st.integers(0, 2**31 - 1)
ops = st.one_of(
    st.builds(AllocateOp, ids, tokens, ids, small),
    st.builds(AppendOp, ids, tokens, small, st.integers(0, 2**62)),
    st.builds(ForkOp, ids, ids),
    st.builds(FreeOp, ids))
block_ids = st.lists(st.integers(0, 2**40), max_size=20)
results = st.builds(
    OpResult, st.sampled_from(list(OpStatus)), ids, block_ids, st.integers(-2**63, 2**63 - 1),
    block_ids, st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), max_size=4))


def request_bytes(executor_id: str, epoch: int, step_id: int, step_ops: list[BlockOp]) -> bytes:
    """What the executor's client sends."""
    return pb.StepRequest(executor_id=executor_id, epoch=epoch, step_id=step_id,
                          ops=[op_to_proto(op) for op in step_ops]).SerializeToString()


def protobuf_reading(body: bytes) -> tuple[str, int, int, list[BlockOp]] | Exception:
    """What the Step path made of these bytes before: the request and its ops, or the error."""
    try:
        request = pb.StepRequest.FromString(body)
        return request.executor_id, request.epoch, request.step_id, ops_from_proto(request.ops)
    except Exception as error:  # noqa: BLE001 - DecodeError or the converter's InvalidOp
        return error


def plain(step_ops: list[BlockOp]) -> list[tuple]:
    """Ops comparable whatever sequence type holds their token ids."""
    return [(type(op), *(list(v) if isinstance(v, (list, array)) else v
                         for v in (getattr(op, f) for f in op.__slots__)))
            for op in step_ops]


def agrees_with_protobuf(body: bytes) -> bool:
    """The reader's answer is None or protobuf's; returns whether it answered."""
    decoded = decode_step_request(body)
    expected = protobuf_reading(body)
    if decoded is None:
        return False
    assert not isinstance(expected, Exception), f"read bytes protobuf refuses: {expected}"
    executor_id, epoch, step_id, expected_ops = expected
    assert (decoded.executor_id, decoded.epoch, decoded.step_id) == (executor_id, epoch, step_id)
    assert plain(decoded.ops) == plain(expected_ops)
    assert decoded.body == body
    return True


@settings(max_examples=300, deadline=None)
@given(ids, st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.lists(ops, max_size=8))
def test_what_the_executor_sends_is_read_as_protobuf_reads_it(executor_id, epoch, step_id,
                                                               step_ops):
    body = request_bytes(executor_id, epoch, step_id, step_ops)
    assert agrees_with_protobuf(body)
    # The reader identifies a Step by the bytes it came in, the Step RPC by its deterministic
    # serialization: for what our client sends they are the same, so a Step retried over the
    # other transport is recognised.
    assert pb.StepRequest.FromString(body).SerializeToString(deterministic=True) == body


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=4), st.data())
def test_damaged_bytes_are_read_as_protobuf_reads_them_or_left_to_it(step_ops, data):
    body = bytearray(request_bytes("exec-0", 3, 7, step_ops))
    for _ in range(data.draw(st.integers(1, 3))):
        edit = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(0, len(body) - 1)))
        if edit == "flip" and body:
            body[at] ^= 1 << data.draw(st.integers(0, 7))
        elif edit == "cut":
            del body[at:at + data.draw(st.integers(1, 4))]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    agrees_with_protobuf(bytes(body))


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    return bytes([number << 3 | wire_type]) + payload


def length_delimited(number: int, payload: bytes) -> bytes:
    return field(number, 2, bytes([len(payload)]) + payload)


APPEND = pb.BlockOp(append=pb.AppendOp(seq_id="s", packed_token_ids=b"\x05\x00\x00\x00",
                                       lookahead_slots=2)).SerializeToString()
HEADER = pb.StepRequest(executor_id="e", epoch=1, step_id=2).SerializeToString()


@pytest.mark.parametrize("body, why", [
    (HEADER + length_delimited(4, APPEND) + field(9, 0, b"\x01"), "an unknown field"),
    (HEADER + field(2, 0, b"\x05") + length_delimited(4, APPEND), "epoch given twice"),
    (HEADER + length_delimited(4, APPEND + length_delimited(2, b"\x0a\x01t")),
     "an op's kind given twice (protobuf merges them)"),
    (HEADER + length_delimited(4, length_delimited(1, b"\x0a\x01s" + b"\x10\x05")),
     "token ids unpacked"),
    (HEADER + length_delimited(4, length_delimited(2, b"\x0a\x01s\x12\x01\x05")),
     "token ids in the repeated field"),
    (HEADER + length_delimited(4, length_delimited(2, b"\x18" + b"\xff" * 9 + b"\x01")),
     "a negative lookahead (a ten-byte varint)"),
    (HEADER + length_delimited(4, length_delimited(2, b"\x0a\x02\xc3\x28")), "not UTF-8"),
    (HEADER + length_delimited(4, b""), "an op of no kind"),
    (HEADER + length_delimited(4, length_delimited(2, b"\x2a\x03\x01\x02\x03")),
     "packed ids of 3 bytes"),
    (HEADER + b"\x22\x05\x12", "cut short"),
])
def test_what_the_reader_leaves_to_protobuf(body: bytes, why: str) -> None:
    assert decode_step_request(body) is None, why
    assert not agrees_with_protobuf(body)


def test_refused_bytes_keep_protobufs_message() -> None:
    """Left to protobuf, bad bytes get the errors they always got."""
    assert isinstance(protobuf_reading(HEADER + b"\x22\x05\x12"), DecodeError)
    no_kind = protobuf_reading(HEADER + length_delimited(4, b""))
    assert "sets no kind" in str(no_kind)


@settings(max_examples=300, deadline=None)
@given(st.lists(results, max_size=6), st.integers(0, 2**40), st.booleans())
def test_the_answer_is_protobufs_bytes(op_results, num_free_blocks, replayed):
    result = StepResult(op_results, num_free_blocks, replayed)
    assert encode_step_response(result) == step_result_to_proto(result).SerializeToString()


# What the core answers: counts are never negative, and only a failure carries a message.
kept_results = st.builds(
    OpResult, st.sampled_from(list(OpStatus)), ids, block_ids, st.integers(0, 2**40),
    block_ids, st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), max_size=4))


@settings(max_examples=300, deadline=None)
@given(st.lists(kept_results, max_size=6), st.integers(0, 2**40))
def test_a_kept_answer_reads_back_as_it_was(op_results, num_free_blocks):
    """The allocator keeps each Step's answer as these bytes for its retries and snapshots."""
    num_free, packed = decode_step_response(
        encode_step_response(StepResult(op_results, num_free_blocks)))
    assert num_free == num_free_blocks
    assert packed == [(int(r.status), r.message if r.status else "", list(r.block_table),
                       r.num_cached_tokens, list(r.new_blocks),
                       [tuple(copy) for copy in r.copies])
                      for r in op_results]
