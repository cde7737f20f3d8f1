"""Clients that give up at random points, for the client-storm test and `make soak`.

Each request follows a Plan drawn from a seeded `random.Random` and ends as a Result saying how
far it got. All of them run on one asyncio loop (grpc.aio and httpx's AsyncClient, the lightest
clients on 2 cores, as bench/serve/gateway_load.py found), at most `concurrency` at a time.

    kind                     what the client does
    grpc-cancel-after-delay  cancels Generate 1 ms-1 s after starting it (log-uniform: right
                             after submit, while queued, before or after the first token)
    grpc-cancel-after-k      cancels right after reading its k-th streamed message
    http-stream-drop-after-delay, http-stream-drop-after-k: the same, closing the connection
                             of a streamed completion (k counts server-sent chunks)
    http-whole-timeout       asks for a whole response, gives up after 1 ms-1 s (log-uniform)
    grpc-complete, http-stream-complete, http-whole-complete: read to the end

Prompts are token ids (the gateway tokenizes nothing), so a reference answer can come from the
in-process engine. Greedy requests all ask for `greedy_tokens` tokens, so each prompt has one
right answer, and a request that gave up must have received a prefix of it.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field

import grpc
import httpx

from pagedserve.common.client import open_aio_channel
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.gateway_client import prompt_fields

GIVE_UP_KINDS = ("grpc-cancel-after-delay", "grpc-cancel-after-k",
                 "http-stream-drop-after-delay", "http-stream-drop-after-k", "http-whole-timeout")
COMPLETE_KINDS = ("grpc-complete", "http-stream-complete", "http-whole-complete")
# A request still unanswered after this long is stuck: it ends as an error, not a hang.
STUCK_S = 300.0
# What a Result's outcome can be; "error" is anything but giving up or finishing.
OUTCOMES = ("finished", "gave-up-mid-stream", "gave-up-before-output", "error")


@dataclass(frozen=True, slots=True)
class Plan:
    kind: str
    prompt: int              # index into the prompts
    greedy: bool             # temperature 0; else temperature 1 (checked by length only)
    max_tokens: int
    give_up_after: int       # messages or chunks read before giving up (the -after-k kinds)
    give_up_s: float         # seconds before giving up (the -after-delay, -timeout kinds)


@dataclass(slots=True)
class Answer:
    """The right answer to a greedy prompt: token ids (what gRPC shows) and text (HTTP)."""
    token_ids: list[int]
    text: str


@dataclass(slots=True)
class Result:
    plan: Plan
    finished: bool = False   # the last message, [DONE] or the whole body arrived
    outputs: int = 0         # streamed messages or chunks that carried output
    token_ids: list[int] = field(default_factory=list)   # gRPC only
    text: str = ""
    completion_tokens: int = -1   # from usage, when it arrived
    error: str = ""
    ended_at: float = 0.0    # time.monotonic()

    @property
    def outcome(self) -> str:
        if self.error:
            return "error"
        if self.finished:
            return "finished"
        return "gave-up-mid-stream" if self.outputs else "gave-up-before-output"

    @property
    def api(self) -> str:
        return self.plan.kind.split("-", 1)[0]

    def tokens_received(self) -> int:
        """gRPC: exact; HTTP: from usage when finished, else one per chunk (about a token)."""
        if self.api == "grpc":
            return len(self.token_ids)
        return self.completion_tokens if self.finished else self.outputs


def draw_plans(rng: random.Random, mix: dict[str, float], num_prompts: int,
               greedy_tokens: int, sampled_share: float) -> Iterator[Plan]:
    """Endless plans: kinds by the weights in `mix`, give-up points spread over a stream;
    sampled requests ask for 8 to `greedy_tokens` tokens."""
    kinds, weights = list(mix), list(mix.values())
    while True:
        kind = rng.choices(kinds, weights)[0]
        greedy = rng.random() >= sampled_share
        max_tokens = greedy_tokens if greedy else rng.randint(min(8, greedy_tokens),
                                                              greedy_tokens)
        yield Plan(kind, rng.randrange(num_prompts), greedy, max_tokens,
                   give_up_after=rng.randint(1, max_tokens),
                   give_up_s=math.exp(rng.uniform(math.log(0.001), 0.0)))


def wrong_answer(result: Result, answers: list[Answer]) -> str:
    """Why the result is not what its prompt must give ("" when it is, or cannot be judged)."""
    plan = result.plan
    if result.outcome == "error":
        return ""
    if not plan.greedy:
        if result.finished and result.completion_tokens != plan.max_tokens:
            return f"{result.completion_tokens} tokens, asked for {plan.max_tokens}"
        return ""
    answer = answers[plan.prompt]
    if result.api == "grpc":
        got, want = result.token_ids, answer.token_ids
    else:
        got, want = result.text, answer.text
    if result.finished and got != want:
        return f"prompt {plan.prompt}: {got!r} != {want!r}"
    if not result.finished and got != want[:len(got)]:
        return f"prompt {plan.prompt}: {got!r} is not a prefix of {want!r}"
    return ""


class ImpatientClients:
    """One gRPC channel and one HTTP connection pool to a gateway; `run` serves plans."""

    def __init__(self, grpc_target: str, http_url: str, prompts: list[list[int]],
                 concurrency: int) -> None:
        self._prompts = prompts
        self._concurrency = concurrency
        self._channel = open_aio_channel(grpc_target)
        self._stub = pb_grpc.GatewayStub(self._channel)
        self._url = f"{http_url}/v1/completions"
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(STUCK_S))

    async def run(self, plans: Iterator[Plan], count: int | None = None,
                  until: float | None = None,
                  on_result: Callable[[Result], None] | None = None) -> list[Result]:
        """Serves `count` plans, or plans until time.monotonic() passes `until`; each starts as
        soon as one of `concurrency` slots is free. Results in the order they were started."""
        slots = asyncio.Semaphore(self._concurrency)
        tasks: list[asyncio.Task[Result]] = []

        async def one(plan: Plan) -> Result:
            try:
                result = await self.serve(plan)
            finally:
                slots.release()
            if on_result is not None:
                on_result(result)
            return result

        for started, plan in enumerate(plans):
            if count is not None and started >= count:
                break
            await slots.acquire()
            if until is not None and time.monotonic() >= until:
                slots.release()
                break
            tasks.append(asyncio.create_task(one(plan)))
        return list(await asyncio.gather(*tasks))

    async def serve(self, plan: Plan) -> Result:
        result = Result(plan)
        serve = self._grpc if result.api == "grpc" else self._http_request
        try:
            if plan.kind.endswith("-after-delay"):
                await asyncio.wait_for(serve(plan, result), plan.give_up_s)
            else:
                await serve(plan, result)
        except TimeoutError:
            pass   # gave up: the cancelled task cancels its call or closes its connection
        except grpc.RpcError as error:
            result.error = f"gRPC {error.code().name}: {error.details()}"
        except httpx.HTTPError as error:
            result.error = f"HTTP {type(error).__name__}: {error}"
        result.ended_at = time.monotonic()
        return result

    def request(self, plan: Plan) -> pb.GenerateRequest:
        return pb.GenerateRequest(sampling=pb.SamplingOptions(
            max_tokens=plan.max_tokens, temperature=0.0 if plan.greedy else 1.0,
            ignore_eos=True), **prompt_fields(self._prompts[plan.prompt]))

    # -- gRPC ----------------------------------------------------------------------------------

    async def _grpc(self, plan: Plan, result: Result) -> None:
        call = self._stub.Generate(self.request(plan), timeout=STUCK_S)
        limit = plan.give_up_after if plan.kind == "grpc-cancel-after-k" else None
        try:
            await self._read_grpc(call, result, limit)
        finally:   # also when the task is cancelled (the -after-delay kind)
            if not result.finished:
                call.cancel()

    @staticmethod
    async def _read_grpc(call, result: Result, limit: int | None) -> None:
        async for message in call:
            for choice in message.choices:
                result.token_ids += choice.token_ids
                result.text += choice.text
                if choice.finish_reason == pb.FINISH_REASON_ERROR:
                    result.error = choice.error or "error"
            result.outputs += any(choice.token_ids for choice in message.choices)
            if message.HasField("usage"):
                result.completion_tokens = message.usage.completion_tokens
                result.finished = True
            if limit is not None and result.outputs >= limit:
                return
        if not result.finished:
            result.error = result.error or "the stream ended before its last message"

    # -- HTTP ----------------------------------------------------------------------------------

    def _body(self, plan: Plan, stream: bool) -> dict:
        body = {"prompt": self._prompts[plan.prompt], "max_tokens": plan.max_tokens,
                "temperature": 0.0 if plan.greedy else 1.0, "ignore_eos": True,
                "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    async def _http_request(self, plan: Plan, result: Result) -> None:
        if plan.kind.startswith("http-stream"):
            await self._http_stream(plan, result)
        else:
            await self._http_whole(plan, result)

    async def _http_stream(self, plan: Plan, result: Result) -> None:
        limit = plan.give_up_after if plan.kind == "http-stream-drop-after-k" else None
        # Leaving this block early closes the connection: the disconnect the gateway must see.
        async with self._http.stream("POST", self._url, json=self._body(plan, True)) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())!r}"
                return
            async with aclosing(response.aiter_lines()) as lines:
                async for line in lines:
                    if line == "data: [DONE]":
                        result.finished = not result.error
                        return
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        result.error = str(chunk["error"].get("message", chunk["error"]))
                    for choice in chunk.get("choices", ()):
                        result.text += choice["text"]
                        result.outputs += 1
                    if chunk.get("usage"):
                        result.completion_tokens = chunk["usage"]["completion_tokens"]
                    if limit is not None and result.outputs >= limit:
                        return
            result.error = result.error or "the stream ended before [DONE]"

    async def _http_whole(self, plan: Plan, result: Result) -> None:
        gives_up = plan.kind == "http-whole-timeout"
        timeout = httpx.Timeout(STUCK_S, read=plan.give_up_s if gives_up else STUCK_S)
        try:
            response = await self._http.post(self._url, json=self._body(plan, False),
                                             timeout=timeout)
        except httpx.ReadTimeout:
            if not gives_up:
                raise
            return   # gave up: httpx closes the connection, which the gateway sees
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {response.text}"
            return
        body = response.json()
        result.text = body["choices"][0]["text"]
        result.completion_tokens = body["usage"]["completion_tokens"]
        result.finished = True

    async def aclose(self) -> None:
        await self._channel.close()
        await self._http.aclose()
