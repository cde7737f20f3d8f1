"""Sampling parameters on the executor's wire (pagedserve.executor.v1.SamplingParams), both
directions: the gateway encodes every field explicitly, the executor decodes with the defaults
the proto documents for a field left unset (a client of its own may leave them)."""
from __future__ import annotations

from pagedserve.executor.v1 import executor_pb2 as pb
from pagedserve.protocol.sampling_params import DEFAULT_MAX_TOKENS, EarlyStopping, SamplingParams
from pagedserve.protocol.structured_output import STRUCTURED_KINDS, StructuredOutput

# The proto's EarlyStopping values (the gateway's enum has the same numbers) and
# transformers' early_stopping settings they stand for.
EARLY_STOPPING = {0: False, 1: True, 2: "never"}


def early_stopping_from_proto(number: int) -> EarlyStopping:
    """An unknown number (a newer client's) reads as the default, as proto3 enums do."""
    return EARLY_STOPPING.get(number, False)


def early_stopping_to_proto(value: EarlyStopping) -> int:
    return next(number for number, setting in EARLY_STOPPING.items()
                if setting == value and type(setting) is type(value))


# The proto's StructuredOutputKind numbers (the gateway's enum has the same): 0 is unspecified.
STRUCTURED_KIND_NUMBERS = {kind: number for number, kind in enumerate(STRUCTURED_KINDS, 1)}


def structured_to_proto(structured: StructuredOutput, message) -> None:
    """Fills `message` (either package's StructuredOutput message, same field numbers)."""
    message.kind = STRUCTURED_KIND_NUMBERS[structured.kind]
    message.spec = structured.spec


def structured_from_proto(message) -> StructuredOutput:
    """An unknown or unspecified kind keeps its number as the kind, which validation refuses
    by name rather than running unconstrained."""
    kind = next((k for k, number in STRUCTURED_KIND_NUMBERS.items() if number == message.kind),
                f"#{message.kind}")
    return StructuredOutput(kind, message.spec)


def sampling_to_proto(params: SamplingParams) -> pb.SamplingParams:
    message = pb.SamplingParams(
        n=params.n, max_tokens=params.max_tokens, temperature=params.temperature,
        top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
        repetition_penalty=params.repetition_penalty, presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty, stop_token_ids=params.stop_token_ids,
        ignore_eos=params.ignore_eos, beam_width=params.beam_width,
        length_penalty=params.length_penalty,
        early_stopping=early_stopping_to_proto(params.early_stopping),
        best_of=params.best_of or 0)
    if params.seed is not None:
        message.seed = params.seed
    if params.logprobs is not None:
        message.logprobs = params.logprobs
    if params.prompt_logprobs is not None:
        message.prompt_logprobs = params.prompt_logprobs
    if params.structured is not None:
        structured_to_proto(params.structured, message.structured)
    message.logit_bias.update(dict(params.logit_bias))
    message.allowed_token_ids.extend(params.allowed_token_ids)
    return message


def sampling_from_proto(message: pb.SamplingParams) -> SamplingParams:
    """Ranges are checked by the engine, not here."""
    return SamplingParams(
        n=message.n or 1,
        max_tokens=message.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=message.temperature if message.HasField("temperature") else 1.0,
        top_k=message.top_k,
        top_p=message.top_p if message.HasField("top_p") else 1.0,
        min_p=message.min_p,
        seed=message.seed if message.HasField("seed") else None,
        repetition_penalty=(message.repetition_penalty
                            if message.HasField("repetition_penalty") else 1.0),
        presence_penalty=message.presence_penalty,
        frequency_penalty=message.frequency_penalty,
        stop_token_ids=tuple(message.stop_token_ids),
        ignore_eos=message.ignore_eos,
        logprobs=message.logprobs if message.HasField("logprobs") else None,
        prompt_logprobs=(message.prompt_logprobs if message.HasField("prompt_logprobs")
                         else None),
        beam_width=message.beam_width,
        length_penalty=(message.length_penalty if message.HasField("length_penalty")
                        else 1.0),
        early_stopping=early_stopping_from_proto(message.early_stopping),
        best_of=message.best_of or None,
        structured=(structured_from_proto(message.structured)
                    if message.HasField("structured") else None),
        logit_bias=tuple(sorted(message.logit_bias.items())),
        allowed_token_ids=tuple(message.allowed_token_ids),
    )
