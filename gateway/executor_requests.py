"""The gateway's sampling settings as the executor's SamplingParams message (the inverse of the
executor's own sampling_from_proto: every field is set explicitly, so no default is guessed
twice)."""
from __future__ import annotations

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.executor.v1 import executor_pb2 as pb


def sampling_to_proto(params: SamplingParams) -> pb.SamplingParams:
    message = pb.SamplingParams(
        n=params.n, max_tokens=params.max_tokens, temperature=params.temperature,
        top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
        repetition_penalty=params.repetition_penalty, presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty, stop_token_ids=params.stop_token_ids,
        ignore_eos=params.ignore_eos)
    if params.seed is not None:
        message.seed = params.seed
    if params.logprobs is not None:
        message.logprobs = params.logprobs
    return message
