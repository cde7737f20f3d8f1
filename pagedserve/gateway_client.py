"""A Python client for the gateway's gRPC API: text (or token ids, or chat) in, text out.

    with GatewayClient("127.0.0.1:50051", api_key="k") as client:
        for delta in client.stream("Hello", max_tokens=32):
            print(delta.text, end="", flush=True)
        print(client.complete("Hello", n=2, seed=7).texts)

Every method raises grpc.RpcError when the call fails (its `.code()` and `.details()` say why:
INVALID_ARGUMENT naming the bad field, UNAUTHENTICATED for a wrong key, UNAVAILABLE when no
executor serves the model, or when the one serving it failed mid-stream...). Sampling options
the caller leaves as None stay unset in the request, so the gateway applies its documented
defaults.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import grpc

from pagedserve.common.client import open_channel
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.protocol.finish_reason import finish_reason_from_proto

# A prompt: plain text, token ids, or chat messages ({"role": ..., "content": ...}).
Prompt = str | Sequence[int] | Sequence[Mapping[str, str]]


@dataclass(frozen=True, slots=True)
class Delta:
    """One completion's progress in one streamed message."""

    index: int                      # which of the n completions (0-based)
    text: str                       # new text; a completion's deltas concatenated are its text
    token_ids: tuple[int, ...]      # tokens generated since this completion's previous delta
    finish_reason: str | None       # "stop", "length", "cancelled", "error"; None: still going
    error: str                      # why, when finish_reason is "error"
    logprobs: tuple[pb.TokenLogprob, ...]  # one per token id, when the request asked for them


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int              # tokens in the prompt
    completion_tokens: int          # tokens generated, over all completions
    cached_tokens: int              # prompt tokens served from the prefix cache


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request, assembled; list entries are indexed by completion."""

    texts: list[str]
    token_ids: list[list[int]]
    finish_reasons: list[str | None]
    usage: Usage | None             # None only when the stream ended without its last message
    model: str
    request_id: str


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str                         # the name to pass as `model`
    max_model_len: int              # context window: prompt + generated tokens
    vocab_size: int                 # token ids are below this
    num_executors: int              # executors ready to serve it


class GenerationStream:
    """The deltas of one Generate call, iterated once. `model` and `request_id` are filled by
    the first message, `usage` by the last; `cancel()` ends the generation (the gateway frees
    its KV blocks) and iteration then stops quietly instead of raising CANCELLED."""

    def __init__(self, call: grpc.Call) -> None:
        self._call = call
        self._cancelled = False
        self.model = ""
        self.request_id = ""
        self.usage: Usage | None = None

    def __iter__(self) -> Iterator[Delta]:
        try:
            for message in self._call:
                self.model = self.model or message.model
                self.request_id = self.request_id or message.request_id
                if message.HasField("usage"):
                    u = message.usage
                    self.usage = Usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
                for choice in message.choices:
                    yield Delta(choice.index, choice.text, tuple(choice.token_ids),
                                finish_reason_from_proto(choice.finish_reason), choice.error,
                                tuple(choice.logprobs))
        except grpc.RpcError as error:
            if not (self._cancelled and error.code() == grpc.StatusCode.CANCELLED):
                raise

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()


class GatewayClient:
    """One channel to a gateway; `timeout_s` (None: no deadline) bounds every call, a whole
    stream included. Thread-safe as gRPC channels are; close it, or use it with `with`."""

    def __init__(self, target: str = "127.0.0.1:50051", api_key: str = "", tls_ca: str = "",
                 timeout_s: float | None = None) -> None:
        self._channel = open_channel(target, api_key, tls_ca)
        self._stub = pb_grpc.GatewayStub(self._channel)
        self._timeout_s = timeout_s

    def stream(self, prompt: Prompt, *, model: str = "", max_tokens: int | None = None,
               temperature: float | None = None, top_p: float | None = None,
               top_k: int | None = None, n: int | None = None, seed: int | None = None,
               stop: Sequence[str] = (), logprobs: int | None = None, ignore_eos: bool = False,
               cache_salt: str = "") -> GenerationStream:
        """Starts generating; iterate the result for deltas as the gateway decodes them."""
        sampling = pb.SamplingOptions(ignore_eos=ignore_eos)
        for name, value in (("max_tokens", max_tokens), ("temperature", temperature),
                            ("top_p", top_p), ("top_k", top_k), ("n", n), ("seed", seed),
                            ("logprobs", logprobs)):
            if value is not None:
                setattr(sampling, name, value)
        request = pb.GenerateRequest(model=model, sampling=sampling, stop=list(stop),
                                     cache_salt=cache_salt, **prompt_fields(prompt))
        return GenerationStream(self._stub.Generate(request, timeout=self._timeout_s))

    def complete(self, prompt: Prompt, **options) -> Completion:
        """Generates to the end and returns the assembled completions (same options as
        `stream`)."""
        generation = self.stream(prompt, **options)
        texts: dict[int, list[str]] = {}
        token_ids: dict[int, list[int]] = {}
        finish_reasons: dict[int, str | None] = {}
        for delta in generation:
            texts.setdefault(delta.index, []).append(delta.text)
            token_ids.setdefault(delta.index, []).extend(delta.token_ids)
            finish_reasons[delta.index] = delta.finish_reason
        count = max([options.get("n") or 1, *(i + 1 for i in texts)])
        return Completion(
            texts=["".join(texts.get(i, [])) for i in range(count)],
            token_ids=[token_ids.get(i, []) for i in range(count)],
            finish_reasons=[finish_reasons.get(i) for i in range(count)],
            usage=generation.usage, model=generation.model, request_id=generation.request_id)

    def tokenize(self, prompt: str | Sequence[Mapping[str, str]], model: str = "") -> list[int]:
        """The token ids the gateway would serve `prompt` as (chat rendered with the template)."""
        fields = prompt_fields(prompt)
        if "token_ids" in fields:
            raise TypeError("tokenize takes text or chat messages, not token ids")
        reply = self._stub.Tokenize(pb.TokenizeRequest(model=model, **fields),
                                    timeout=self._timeout_s)
        return list(reply.token_ids)

    def list_models(self) -> list[ModelInfo]:
        """The models with at least one ready executor, in id order."""
        reply = self._stub.ListModels(pb.ListModelsRequest(), timeout=self._timeout_s)
        return [ModelInfo(m.id, m.max_model_len, m.vocab_size, m.num_executors)
                for m in reply.models]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def prompt_fields(prompt: Prompt) -> dict[str, object]:
    """The request's `prompt` oneof for a str (text), ints (token ids) or mappings (chat).
    An empty sequence goes as empty token ids, which the gateway refuses by name."""
    if isinstance(prompt, str):
        return {"text": prompt}
    items = list(prompt)
    if items and all(isinstance(item, Mapping) for item in items):
        return {"chat": pb.ChatPrompt(messages=[
            pb.ChatMessage(role=m["role"], content=m["content"]) for m in items])}
    if all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        return {"token_ids": pb.TokenIds(ids=items)}
    raise TypeError("a prompt is a str, a sequence of token ids, or a sequence of "
                    "{'role', 'content'} mappings")
