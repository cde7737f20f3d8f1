"""proto <-> domain conversions of the executor's own messages (request updates, refusals,
request ids). Sampling parameters and finish reasons are the shared protocol's codecs."""
from __future__ import annotations

from executor_service.engine.request_output import RequestOutput, TokenLogprob
from executor_service.serving_loop import Refusal
from pagedserve.common.error_interceptor import status_of
from pagedserve.common.errors import InvalidArgument
from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.protocol.finish_reason import finish_reason_to_proto
from pagedserve.protocol.limits import Limits
from pagedserve.protocol.sampling_params import MAX_N

# A request's sequence ids are "<request_id>#<index>", and the allocator refuses a whole Step
# (every request in it) over one id longer than its limit: the request id leaves room for the
# longest suffix.
MAX_SEQ_ID = Limits().max_id_length
MAX_REQUEST_ID = MAX_SEQ_ID - len(f"#{MAX_N - 1}")


def check_request_id(request_id: str) -> None:
    if not 1 <= len(request_id) <= MAX_REQUEST_ID:
        raise InvalidArgument(f"request_id must be 1 to {MAX_REQUEST_ID} characters (its "
                              f"sequence ids must fit the allocator's {MAX_SEQ_ID}), got "
                              f"{len(request_id)}")


def update_to_proto(output: RequestOutput) -> pb.RequestUpdate:
    update = pb.RequestUpdate(request_id=output.request_id, finished=output.finished)
    for delta in output.deltas:
        completion = update.completions.add(index=delta.index, token_ids=delta.token_ids,
                                            finish_reason=finish_reason_to_proto(delta.finish_reason))
        if delta.score is not None:
            completion.cumulative_logprob = delta.cumulative_logprob
            completion.score = delta.score
        for logprob in delta.logprobs or ():
            completion.logprobs.append(logprob_to_proto(logprob))
    for logprob in output.prompt_logprobs or ():
        update.prompt_logprobs.append(logprob_to_proto(logprob))
    if output.usage is not None:
        update.usage.CopyFrom(pb.Usage(prompt_tokens=output.usage.prompt_tokens,
                                       completion_tokens=output.usage.completion_tokens,
                                       cached_tokens=output.usage.cached_tokens))
    if output.error:
        update.error, update.error_code = output.error, 13  # INTERNAL
    return update


def logprob_to_proto(logprob: TokenLogprob) -> pb.TokenLogprob:
    return pb.TokenLogprob(token_id=logprob.token_id, logprob=logprob.logprob,
                           top=[pb.TopLogprob(token_id=t, logprob=p) for t, p in logprob.top],
                           rank=logprob.rank)


def refusal_to_proto(refusal: Refusal) -> pb.RequestUpdate:
    code = status_of(refusal.error).value[0]
    return pb.RequestUpdate(request_id=refusal.request_id, finished=True,
                            error=str(refusal.error), error_code=code)
