"""pagedserve.gateway.v1 messages ↔ the gateway's domain objects; nothing else."""
from __future__ import annotations

from gateway.choice_stream import ChoiceDelta, TokenLogprob
from gateway.generation import GenerationEvent
from gateway.generation_request import ChatMessage, GenerationRequest
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.protocol.finish_reason import finish_reason_to_proto
from pagedserve.protocol.sampling_codec import early_stopping_from_proto, structured_from_proto
from pagedserve.protocol.sampling_params import DEFAULT_MAX_TOKENS, SamplingParams


def _optional(message, name: str, default):
    return getattr(message, name) if message.HasField(name) else default


def sampling_from_proto(message: pb.SamplingOptions) -> SamplingParams:
    return SamplingParams(
        n=_optional(message, "n", 1),
        temperature=_optional(message, "temperature", 1.0),
        top_k=_optional(message, "top_k", 0),
        top_p=_optional(message, "top_p", 1.0),
        min_p=_optional(message, "min_p", 0.0),
        seed=_optional(message, "seed", None),
        repetition_penalty=_optional(message, "repetition_penalty", 1.0),
        presence_penalty=_optional(message, "presence_penalty", 0.0),
        frequency_penalty=_optional(message, "frequency_penalty", 0.0),
        stop_token_ids=tuple(message.stop_token_ids),
        ignore_eos=message.ignore_eos,
        logprobs=_optional(message, "logprobs", None),
        prompt_logprobs=_optional(message, "prompt_logprobs", None),
        beam_width=_optional(message, "beam_width", 0),
        length_penalty=_optional(message, "length_penalty", 1.0),
        early_stopping=early_stopping_from_proto(message.early_stopping),
        best_of=_optional(message, "best_of", None),
        structured=(structured_from_proto(message.structured)
                    if message.HasField("structured") else None),
        logit_bias=tuple(sorted(message.logit_bias.items())),
        allowed_token_ids=tuple(message.allowed_token_ids))


def chat_from_proto(message: pb.ChatPrompt) -> tuple[tuple[ChatMessage, ...], bool]:
    return (tuple(ChatMessage(m.role, m.content) for m in message.messages),
            _optional(message, "add_generation_prompt", True))


def request_from_proto(message: pb.GenerateRequest) -> GenerationRequest:
    kind = message.WhichOneof("prompt")
    chat, add_generation_prompt = (chat_from_proto(message.chat) if kind == "chat"
                                   else (None, True))
    return GenerationRequest(
        model=message.model,
        text=message.text if kind == "text" else None,
        token_ids=tuple(message.token_ids.ids) if kind == "token_ids" else None,
        chat=chat, add_generation_prompt=add_generation_prompt,
        sampling=sampling_from_proto(message.sampling),
        max_tokens=_optional(message.sampling, "max_tokens", DEFAULT_MAX_TOKENS),
        stop=tuple(message.stop), cache_salt=message.cache_salt,
        keep_special_tokens=message.keep_special_tokens)


def tokenize_request_from_proto(message: pb.TokenizeRequest) -> GenerationRequest:
    kind = message.WhichOneof("prompt")
    chat, add_generation_prompt = (chat_from_proto(message.chat) if kind == "chat"
                                   else (None, True))
    return GenerationRequest(model=message.model,
                             text=message.text if kind == "text" else None,
                             chat=chat, add_generation_prompt=add_generation_prompt)


def choice_to_proto(delta: ChoiceDelta) -> pb.ChoiceDelta:
    message = pb.ChoiceDelta(index=delta.index, text=delta.text, token_ids=delta.token_ids,
                             finish_reason=finish_reason_to_proto(delta.finish_reason),
                             error=delta.error)
    if delta.score is not None:
        message.cumulative_logprob, message.score = delta.cumulative_logprob, delta.score
    message.logprobs.extend(logprob_to_proto(entry) for entry in delta.logprobs)
    return message


def logprob_to_proto(entry: TokenLogprob) -> pb.TokenLogprob:
    return pb.TokenLogprob(token_id=entry.token_id, token=entry.token, logprob=entry.logprob,
                           top=[pb.TopLogprob(token_id=top.token_id, token=top.token,
                                              logprob=top.logprob) for top in entry.top],
                           rank=entry.rank)


def event_to_proto(event: GenerationEvent) -> pb.GenerateResponse:
    response = pb.GenerateResponse(choices=[choice_to_proto(c) for c in event.choices],
                                   model=event.model, request_id=event.request_id)
    if event.prompt is not None and event.prompt.logprobs is not None:
        # The first token's None (nothing to score it on) has no place in a repeated field.
        response.prompt_logprobs.extend(logprob_to_proto(entry)
                                        for entry in event.prompt.logprobs[1:])
    if event.usage is not None:
        response.usage.CopyFrom(pb.Usage(prompt_tokens=event.usage.prompt_tokens,
                                         completion_tokens=event.usage.completion_tokens,
                                         cached_tokens=event.usage.cached_tokens))
    return response
