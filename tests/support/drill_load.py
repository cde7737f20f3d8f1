"""The load of the gateway fault drills: concurrent greedy streams through a real gateway, over
gRPC (GatewayClient) and over HTTP (the official `openai` client, server-sent events), each
recorded as it arrives on a thread of its own, and what an undisturbed engine answers for the
same prompts (token ids, and the text the gateway's detokenizer makes of them).

Prompts are token ids, so both APIs and the in-process reference see exactly the same input.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import openai

from allocator_service.local_block_allocator import LocalBlockAllocator
from executor_service.engine.build import EngineOptions, build_engine
from executor_service.engine.offline import generate
from executor_service.model.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir
from gateway.detokenizer import IncrementalDetokenizer
from gateway.tokenizer import GatewayTokenizer
from pagedserve.allocator.v1 import allocator_pb2 as apb
from pagedserve.allocator.v1 import allocator_pb2_grpc as apb_grpc
from pagedserve.gateway_client import GatewayClient
from pagedserve.protocol.sampling_params import SamplingParams
from pagedserve.supervisor.service_process import ExecutorProcess
from tests.support.executor_session import Stream

MAX_TOKENS = 96
TOPICS = ("paging", "blocks", "caches", "rivers", "trains", "stars", "salt", "glass", "tea",
          "maps", "bees", "clocks", "ropes", "kites", "ink", "wool", "iron", "moss", "snow",
          "sand")


def prompts(tag: str, count: int) -> list[list[int]]:
    """`count` distinct prompts (token ids) that share no full block with other tags' prompts."""
    return [list(f"{tag} {i}: a few words about {TOPICS[i % len(TOPICS)]}".encode())
            for i in range(count)]


@dataclass
class Recorded:
    """What one client saw of its stream."""
    api: str                                    # "grpc" or "http"
    prompt: list[int]
    token_ids: list[int] = field(default_factory=list)   # gRPC only
    text: str = ""
    finish_reason: str | None = None
    request_id: str = ""
    # How the stream failed: a gRPC status, or the error event of an HTTP stream.
    status: grpc.StatusCode | None = None
    error: str = ""
    first_token: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    ended_at: float = 0.0


class Load:
    """Streams started on threads; `wait()` joins them."""

    def __init__(self, grpc_target: str, http_url: str, max_tokens: int = MAX_TOKENS) -> None:
        self.client = GatewayClient(grpc_target, timeout_s=300)
        self.http = openai.OpenAI(base_url=f"{http_url}/v1", api_key="unused", max_retries=0,
                                  timeout=300)
        self.max_tokens = max_tokens
        self.streams: list[Recorded] = []
        self._threads: list[threading.Thread] = []

    def start(self, prompt: list[int], api: str = "grpc") -> Recorded:
        recorded = Recorded(api, prompt)
        run = self._grpc if api == "grpc" else self._http
        thread = threading.Thread(target=self._run, args=(run, recorded), daemon=True)
        self.streams.append(recorded)
        self._threads.append(thread)
        thread.start()
        return recorded

    def start_all(self, all_prompts: Sequence[list[int]], http_every: int = 3
                  ) -> list[Recorded]:
        """Every `http_every`-th prompt goes over HTTP, the others over gRPC."""
        return [self.start(prompt, "http" if i % http_every == http_every - 1 else "grpc")
                for i, prompt in enumerate(all_prompts)]

    def wait(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        unfinished = [r.prompt for r in self.streams if not r.done.is_set()]
        assert not unfinished, f"{len(unfinished)} streams never ended"

    def close(self) -> None:
        self.client.close()
        self.http.close()

    def _run(self, run, recorded: Recorded) -> None:
        try:
            run(recorded)
        finally:
            recorded.ended_at = time.monotonic()
            recorded.done.set()

    def _grpc(self, recorded: Recorded) -> None:
        stream = self.client.stream(recorded.prompt, max_tokens=self.max_tokens, temperature=0,
                                    ignore_eos=True)
        try:
            for delta in stream:
                recorded.request_id = stream.request_id
                recorded.token_ids += delta.token_ids
                recorded.text += delta.text
                recorded.finish_reason = delta.finish_reason or recorded.finish_reason
                recorded.error = delta.error or recorded.error
                if recorded.token_ids:
                    recorded.first_token.set()
        except grpc.RpcError as error:
            recorded.status, recorded.error = error.code(), error.details()

    def _http(self, recorded: Recorded) -> None:
        try:
            stream = self.http.completions.create(
                model=EMBEDDED_MODEL_NAME, prompt=recorded.prompt, max_tokens=self.max_tokens,
                temperature=0, stream=True, extra_body={"ignore_eos": True})
            recorded.request_id = stream.response.headers.get("x-request-id", "")
            for chunk in stream:
                for choice in chunk.choices:
                    recorded.text += choice.text
                    recorded.finish_reason = choice.finish_reason or recorded.finish_reason
                    if recorded.text:
                        recorded.first_token.set()
        except openai.APIError as error:
            recorded.error = error.message


@dataclass(frozen=True)
class Expected:
    token_ids: list[int]
    text: str


def undisturbed(cache: Path, all_prompts: Sequence[list[int]], max_tokens: int = MAX_TOKENS
                ) -> list[Expected]:
    """What the in-process engine answers, greedily, for each prompt, and the text the gateway
    makes of those tokens (its own detokenizer over the model's tokenizer files)."""
    directory = embedded_model_dir(cache)
    engine = build_engine(directory, EngineOptions(num_blocks=256), LocalBlockAllocator())
    completions = generate(engine, list(all_prompts), SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True))
    tokenizer = GatewayTokenizer.from_files({path.name: path.read_bytes()
                                            for path in directory.iterdir() if path.is_file()})
    expected = []
    for prompt, completion in zip(all_prompts, completions):
        token_ids = completion.choices[0]
        detokenizer = IncrementalDetokenizer(tokenizer.tokenizer, True, prompt)
        expected.append(Expected(token_ids, detokenizer.add(token_ids) + detokenizer.finish()))
    return expected


def matches(recorded: Recorded, expected: Expected) -> bool:
    """The stream ended normally with exactly the undisturbed answer."""
    if recorded.status is not None or recorded.error or recorded.finish_reason != "length":
        return False
    if recorded.api == "grpc" and recorded.token_ids != expected.token_ids:
        return False
    return recorded.text == expected.text


def describe(streams: Sequence[Recorded], expected: Sequence[Expected]) -> list[str]:
    """One line per stream, for assertion messages."""
    return [f"{r.api} {r.request_id}: finish={r.finish_reason} status={r.status} "
            f"error={r.error!r} tokens={len(r.token_ids)} text_ok={r.text == e.text}"
            for r, e in zip(streams, expected)]


def warm_up(executor: ExecutorProcess) -> None:
    """One short request straight on the executor's Session. A fresh process's first iterations
    are slow (lazy initialisation), and on a busy 2-core machine slow enough to outlast a 2-3 s
    lease; the drills want only the leases they break on purpose to lapse."""
    stream = Stream(executor)
    stream.submit("warm-up", list(b"warm up"), max_tokens=4, temperature=0, ignore_eos=True)
    stream.until_finished("warm-up", timeout_s=120)
    stream.close()


def listed(admin: apb_grpc.AllocatorAdminStub) -> dict[str, int]:
    """Executor id -> epoch, as the allocator lists them."""
    return {e.executor_id: e.epoch
            for e in admin.ListExecutors(apb.ListExecutorsRequest(), timeout=5).executors}
