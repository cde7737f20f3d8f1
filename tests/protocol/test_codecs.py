"""The shared protocol's other codecs: finish reasons on both protos, sampling parameters on the
executor's wire."""
from __future__ import annotations

import pytest

from pagedserve.executor.v1 import executor_pb2 as epb
from pagedserve.gateway.v1 import gateway_pb2 as gpb
from pagedserve.protocol.finish_reason import finish_reason_from_proto, finish_reason_to_proto
from pagedserve.protocol.sampling_codec import sampling_from_proto, sampling_to_proto
from pagedserve.protocol.sampling_params import (DEFAULT_MAX_TOKENS, InvalidSamplingParams,
                                                 SamplingParams)
from pagedserve.protocol.structured_output import StructuredOutput


def test_both_protos_number_finish_reasons_alike() -> None:
    # One table serves both enums only while they agree name for name and number for number.
    assert dict(epb.FinishReason.items()) == dict(gpb.FinishReason.items())


def test_every_finish_reason_round_trips_and_an_unknown_number_reads_as_error() -> None:
    for reason in (None, "stop", "length", "cancelled", "error"):
        assert finish_reason_from_proto(finish_reason_to_proto(reason)) == reason
    assert finish_reason_to_proto("length") == epb.FINISH_REASON_LENGTH == gpb.FINISH_REASON_LENGTH
    assert finish_reason_from_proto(99) == "error"


def test_sampling_params_round_trip_through_the_executor_proto() -> None:
    params = SamplingParams(n=3, max_tokens=7, temperature=0.5, top_k=4, top_p=0.9, min_p=0.1,
                            seed=11, repetition_penalty=1.2, presence_penalty=0.3,
                            frequency_penalty=-0.4, stop_token_ids=(5, 6), ignore_eos=True,
                            logprobs=2)
    decoded = sampling_from_proto(sampling_to_proto(params))
    # float32 on the wire: compare the floats approximately, everything else exactly.
    for name in SamplingParams.__slots__:
        sent, got = getattr(params, name), getattr(decoded, name)
        assert (abs(sent - got) < 1e-6) if isinstance(sent, float) else sent == got, name


def test_an_empty_sampling_message_takes_the_documented_defaults() -> None:
    assert sampling_from_proto(epb.SamplingParams()) == SamplingParams()
    assert SamplingParams().max_tokens == DEFAULT_MAX_TOKENS == 16


def test_constraints_round_trip_and_both_protos_number_kinds_alike() -> None:
    assert dict(epb.StructuredOutputKind.items()) == dict(gpb.StructuredOutputKind.items())
    for kind, spec in (("json_schema", '{"type": "object"}'), ("json_object", ""),
                       ("regex", "a+"), ("choice", '["a"]'), ("grammar", 'root ::= "a"')):
        params = SamplingParams(structured=StructuredOutput(kind, spec),
                                logit_bias=((3, -100.0), (9, 2.5)), allowed_token_ids=(4, 2))
        assert sampling_from_proto(sampling_to_proto(params)) == params
    # A kind this build does not know keeps its number, and validation refuses it by name.
    message = epb.SamplingParams(structured=epb.StructuredOutput(kind=9, spec="x"))
    with pytest.raises(InvalidSamplingParams, match="structured output kind must be one of"):
        sampling_from_proto(message).validate(100)
