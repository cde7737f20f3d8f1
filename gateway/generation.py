"""One request's life in the gateway, the same for gRPC and HTTP clients:

    check fields → pick the model → tokenize, check the context window → admission (limits)
    → route (MatchPrefix + load) → submit on the executor's Session → token ids in,
    text deltas out (per choice: detokenize, stop strings) → usage on the last event

The caller iterates `generate()`, an async generator on the gateway's event loop (the gRPC
and HTTP servers share the loop). A client that goes away cancels its task, or stops iterating
and closes the generator: either way the executor request is cancelled at once, and its blocks
are freed within an iteration. A request whose executor link breaks before any token was sent
is resubmitted once to another executor; after that the choices end with an error.

Why a loop and not a thread per request: every engine iteration brings one token to each open
stream. With a thread per stream, that is a wake-up (and a blocking gRPC send) per stream per
iteration; on the loop it is one wake-up per iteration for all of them (docs/gateway.md).
Blocking work stays off the loop: tokenizing (a long text prompt takes milliseconds) and the
allocator's MatchPrefix run on worker threads.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from gateway.admission import Admission
from gateway.choice_stream import ChoiceDelta, ChoiceStream
from gateway.executors import router
from gateway.executors.directory import ExecutorDirectory, ExecutorEntry, ServedModel
from gateway.executors.link import LinkLost
from gateway.generation_request import GenerationRequest
from gateway.prompt import generation_budget, prompt_token_ids
from gateway.prompt_report import PromptReport, prompt_report
from gateway.tenancy import scoped_salt
from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.common import errors
from pagedserve.common.allocator_group import AllocatorGroup
from pagedserve.common.errors import InvalidArgument, NotFound, Unavailable
from pagedserve.protocol.finish_reason import finish_reason_from_proto
from pagedserve.protocol.sampling_codec import sampling_to_proto

log = logging.getLogger(__name__)
MATCH_TIMEOUT_S = 2.0
ATTEMPTS = 2


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(slots=True)
class GenerationEvent:
    choices: list[ChoiceDelta] = field(default_factory=list)
    # On the last event only.
    usage: Usage | None = None
    # On the first event only.
    model: str = ""
    request_id: str = ""
    # On the first event, when the request echoes its prompt or asks for prompt logprobs.
    prompt: PromptReport | None = None
    # In a batch of prompts (openai_http/batch.py): which prompt `prompt` is.
    prompt_index: int = 0
    # On the first event: the prompt's token count (the usage's, ahead of the last event).
    prompt_tokens: int = 0
    # On the first event only: when (time.monotonic()) the request was submitted to the
    # executor that serves it, after tokenizing, admission and routing (the queue time's end).
    submitted_at: float | None = None

    @property
    def failure(self) -> str | None:
        """The error the first choice that failed in this event ended with; None if none did."""
        for delta in self.choices:
            if delta.finish_reason == "error":
                return delta.error or "generation failed"
        return None


class Generator:
    def __init__(self, directory: ExecutorDirectory, allocators: AllocatorGroup,
                 admission: Admission) -> None:
        self.directory = directory
        self._allocators = allocators
        self.admission = admission

    def model(self, name: str) -> ServedModel:
        models = self.directory.models
        if not models:
            raise Unavailable("no executor is ready yet; retry shortly")
        if not name:
            if len(models) > 1:
                raise InvalidArgument(f"model must be given: this gateway serves "
                                      f"{', '.join(sorted(models))}")
            return next(iter(models.values()))
        if name not in models:
            raise NotFound(f"model {name!r} is not served here; served: "
                           f"{', '.join(sorted(models))}")
        return models[name]

    def tokenize(self, request: GenerationRequest) -> tuple[list[int], ServedModel]:
        request.check()
        model = self.model(request.model)
        return prompt_token_ids(request, model), model

    async def generate(self, request: GenerationRequest, tenant: str = ""
                       ) -> AsyncIterator[GenerationEvent]:
        """`tenant` (gateway/tenancy.py) scopes the request's prefix cache."""
        prompt, model = await asyncio.to_thread(self.tokenize, request)
        # max_tokens 0 (score or echo the prompt only): the executor generates one token,
        # which is dropped, as vLLM does; the prompt's logits are what is wanted.
        max_tokens = max(1, generation_budget(request, len(prompt), model))
        sampling = replace(request.sampling, max_tokens=max_tokens)
        sampling.validate(model.vocab_size)
        salt = scoped_salt(tenant, request.cache_salt)
        async with self.admission.slot():
            async for event in self._serve(request, model, prompt, sampling, salt):
                yield event

    async def _serve(self, request, model, prompt, sampling, salt: str
                     ) -> AsyncIterator[GenerationEvent]:
        request_id = new_request_id()
        choices = [ChoiceStream(index, model.tokenizer, prompt, request.stop,
                                not request.keep_special_tokens)
                   for index in range(sampling.n)]
        first = GenerationEvent(model=model.name, request_id=request_id)
        reports_prompt = request.echo or sampling.prompt_logprobs is not None
        tried: set[str] = set()
        for attempt in range(ATTEMPTS):
            entry = await self._route(model, prompt, salt, tried)
            tried.add(entry.executor_id)
            link = entry.link
            updates = link.submit(request_id, prompt, sampling_to_proto(sampling), salt)
            if first is not None:
                first.submitted_at = time.monotonic()
            sent_tokens = False
            scored = []   # the prompt's scores (executor TokenLogprob messages)
            held = GenerationEvent()
            executor_done = False
            try:
                while True:
                    update = await updates.get()
                    executor_done = isinstance(update, LinkLost) or update.finished
                    if isinstance(update, LinkLost):
                        if not sent_tokens and attempt + 1 < ATTEMPTS:
                            log.warning("%s: %s; resubmitting", request_id, update.message)
                            break
                        yield self._fail(choices, len(prompt),
                                         f"executor failed: {update.message}")
                        return
                    if update.error:
                        if not sent_tokens:
                            raise executor_refusal(update)
                        yield self._fail(choices, len(prompt), update.error)
                        return
                    scored += update.prompt_logprobs
                    event = self._advance(choices, update, link, request_id,
                                          score_only=request.max_tokens == 0)
                    if all(choice.finished for choice in choices) and not update.finished:
                        # Every choice met a stop string and the executor request is being
                        # cancelled: its last update (usage, cached tokens) is an iteration
                        # away, and these deltas go out with it.
                        held.choices += event.choices
                        continue
                    event.choices[:0], held.choices = held.choices, []
                    if not (event.choices or update.finished):
                        continue   # e.g. the prompt's scores, ahead of the first token
                    if first is not None:
                        event.model, event.request_id = first.model, first.request_id
                        event.submitted_at, first = first.submitted_at, None
                        event.prompt_tokens = len(prompt)
                        if reports_prompt:
                            # The scores come by the first token's update at the latest.
                            event.prompt = prompt_report(
                                model.tokenizer, prompt, request.text,
                                scored if sampling.prompt_logprobs is not None else None)
                    sent_tokens = sent_tokens or any(d.token_ids for d in event.choices)
                    if update.finished:
                        event.usage = Usage(len(prompt), sum(c.num_tokens for c in choices),
                                            update.usage.cached_tokens)
                    yield event
                    if update.finished:
                        return
            finally:
                # Also reached when the client goes away (its task is cancelled, or it closes
                # this generator): the executor must stop computing for nobody.
                if not executor_done:
                    link.cancel(request_id)
                link.forget(request_id)
            request_id = new_request_id()   # the failed executor may still know the old one
        raise Unavailable("no executor could serve the request")  # pragma: no cover

    def _advance(self, choices: list[ChoiceStream], update, link, request_id: str,
                 score_only: bool = False) -> GenerationEvent:
        """`score_only`: max_tokens 0, whose one generated token is dropped."""
        event = GenerationEvent()
        for completion in update.completions:
            choice = choices[completion.index]
            if choice.finished:   # stopped by a stop string; the executor goes on for now
                continue
            if score_only:
                if completion.finish_reason:
                    reason = finish_reason_from_proto(completion.finish_reason)
                    event.choices.append(choice.end(
                        "length" if reason in ("stop", "length") else reason))
                continue
            delta = choice.advance(list(completion.token_ids), completion.logprobs,
                                   completion.finish_reason)
            if completion.HasField("score"):
                delta.cumulative_logprob = completion.cumulative_logprob
                delta.score = completion.score
            event.choices.append(delta)
        if all(choice.finished for choice in choices) and not update.finished:
            link.cancel(request_id)   # every choice hit a stop string
        if update.finished:           # the executor ended choices the gateway had not
            event.choices += [choice.end("cancelled") for choice in choices
                              if not choice.finished]
        return event

    def _fail(self, choices: list[ChoiceStream], prompt_len: int, message: str
              ) -> GenerationEvent:
        return GenerationEvent([choice.end("error", message) for choice in choices
                                if not choice.finished],
                               Usage(prompt_len, sum(c.num_tokens for c in choices), 0))

    async def _route(self, model: ServedModel, prompt: list[int], cache_salt: str,
                     tried: set[str]) -> ExecutorEntry:
        entries = {executor_id: entry for executor_id, entry in model.executors.items()
                   if entry.link.alive and executor_id not in tried}
        if not entries:
            raise Unavailable(f"no executor of {model.name} is reachable; retry shortly")
        if len(entries) == 1:
            # Nothing to choose between: no MatchPrefix round trip to the allocator (under
            # the peer benchmark it was the gateway's largest cost of its own, 16 % of samples).
            return next(iter(entries.values()))
        matches = await asyncio.to_thread(self._matches, prompt, cache_salt)
        candidates = []
        for executor_id, entry in entries.items():
            match = matches.get(executor_id)
            candidates.append(router.Candidate(
                executor_id, cached_tokens=match.num_cached_tokens if match else 0,
                free_blocks=match.num_free_blocks if match else entry.info.num_blocks,
                num_blocks=match.num_blocks if match else entry.info.num_blocks,
                num_waiting=match.num_waiting if match else 0,
                num_open=entry.link.num_open))
        return entries[router.choose(candidates, len(prompt)).executor_id]

    def _matches(self, prompt: list[int], cache_salt: str) -> dict[str, apb.ExecutorMatch]:
        """MatchPrefix per executor, from every shard of the allocator group at once; the
        executors of a shard that does not answer (down) are routed by load alone rather than
        failing the request."""
        started = time.monotonic()
        matches, failed = self._allocators.match_prefix(
            apb.MatchPrefixRequest(token_ids=prompt, cache_salt=cache_salt), MATCH_TIMEOUT_S)
        for shard, error in failed.items():
            log.warning("MatchPrefix failed at allocator %s after %.1f s (%s); routing its "
                        "executors by load", shard, time.monotonic() - started,
                        error.code().name)
        return matches


def new_request_id() -> str:
    return f"gw-{uuid.uuid4().hex[:16]}"


# An executor's refusal (RequestUpdate.error_code, a google.rpc.Code) as the error to raise.
REFUSALS = {3: errors.InvalidArgument, 5: errors.NotFound, 6: errors.AlreadyExists,
            8: errors.ResourceExhausted, 9: errors.FailedPrecondition, 14: errors.Unavailable}


def executor_refusal(update) -> Exception:
    return REFUSALS.get(update.error_code, errors.Unavailable)(update.error)
