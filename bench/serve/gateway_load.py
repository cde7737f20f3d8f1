"""The gateway's two contenders: clients that send the requests through the whole stack, gRPC
(`Generate`, grpc.aio) and HTTP (`/v1/completions` with `"stream": true`, server-sent events,
httpx's AsyncClient), each keeping the same arrival schedule and concurrency cap as the
in-process loop.

Both are one asyncio loop in this process: each request waits for its arrival time, then for
one of `max_concurrency` slots (a semaphore), and its latencies start when it is sent. The
clients share the stack's cores, so they are the lightest this process can make them: the
project's synchronous `GatewayClient` on 64 threads cost 76-85 µs of CPU per output token on
2 cores, grpc.aio 52-60 (the CPU preset at rate ∞; the stack's throughput did not move beyond
the noise either way). Channel and connections live for the whole benchmark, set up in
warm-up.
"""
from __future__ import annotations

import asyncio
import json
import time

import grpc
import httpx
from tqdm import tqdm

from bench.serve.metrics import RequestTrace
from bench.throughput.workload import Workload
from pagedserve.common.client import open_aio_channel
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc
from pagedserve.gateway_client import prompt_fields


class AsyncLoad:
    """The schedule and the cap; subclasses send one request (`_one`) and close."""

    def __init__(self, max_concurrency: int) -> None:
        self._max_concurrency = max_concurrency
        self._loop = asyncio.new_event_loop()

    def serve(self, workload: Workload, arrivals: list[float], cache_salt: str,
              progress: tqdm | None = None) -> tuple[list[RequestTrace], float, float]:
        """Serves every request; returns the traces (in request order), the start and the
        last token's arrival."""
        return self._loop.run_until_complete(
            self._serve(workload, arrivals, cache_salt, progress))

    async def _serve(self, workload: Workload, arrivals: list[float], cache_salt: str,
                     progress: tqdm | None) -> tuple[list[RequestTrace], float, float]:
        traces = [RequestTrace() for _ in workload.prompts]
        slots = asyncio.Semaphore(self._max_concurrency)
        start = time.perf_counter()

        async def one(index: int) -> None:
            await asyncio.sleep(max(0.0, start + arrivals[index] - time.perf_counter()))
            async with slots:
                await self._one(workload.prompts[index], workload.output_lens[index],
                                cache_salt, traces[index])
            if progress is not None:
                progress.update(1)

        await asyncio.gather(*(one(index) for index in range(len(arrivals))))
        end = max((at for trace in traces for at, _ in trace.arrivals), default=start)
        return traces, start, end

    async def _one(self, prompt: list[int], max_tokens: int, cache_salt: str,
                   trace: RequestTrace) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._loop.run_until_complete(self._aclose())
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    async def _aclose(self) -> None:
        pass


class GrpcLoad(AsyncLoad):
    def __init__(self, target: str, max_concurrency: int) -> None:
        super().__init__(max_concurrency)
        self._channel = self._loop.run_until_complete(self._open(target))
        self._stub = pb_grpc.GatewayStub(self._channel)

    @staticmethod
    async def _open(target: str) -> grpc.aio.Channel:
        return open_aio_channel(target)   # made inside the loop it belongs to

    async def _one(self, prompt: list[int], max_tokens: int, cache_salt: str,
                   trace: RequestTrace) -> None:
        request = pb.GenerateRequest(
            sampling=pb.SamplingOptions(max_tokens=max_tokens, temperature=0, ignore_eos=True),
            cache_salt=cache_salt, **prompt_fields(prompt))
        trace.sent_s = time.perf_counter()
        try:
            async for message in self._stub.Generate(request):
                stamp = time.perf_counter()
                for choice in message.choices:
                    trace.arrivals.append((stamp, len(choice.token_ids)))
                    trace.pieces.append(choice.text)
                    trace.token_ids += choice.token_ids
                    if choice.finish_reason == pb.FINISH_REASON_ERROR:
                        trace.error = choice.error or "error"
                if message.HasField("usage"):
                    trace.reported_tokens = message.usage.completion_tokens
        except grpc.RpcError as error:
            trace.error = f"{error.code().name}: {error.details()}"

    async def _aclose(self) -> None:
        await self._channel.close()


class HttpLoad(AsyncLoad):
    def __init__(self, base_url: str, max_concurrency: int) -> None:
        super().__init__(max_concurrency)
        self._url = f"{base_url}/v1/completions"
        limits = httpx.Limits(max_connections=max_concurrency,
                              max_keepalive_connections=max_concurrency)
        self._client = httpx.AsyncClient(limits=limits, timeout=None)

    async def _one(self, prompt: list[int], max_tokens: int, cache_salt: str,
                   trace: RequestTrace) -> None:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "cache_salt": cache_salt, "stream": True,
                "stream_options": {"include_usage": True}}
        trace.sent_s = time.perf_counter()
        try:
            async with self._client.stream("POST", self._url, json=body) as response:
                if response.status_code != 200:
                    trace.error = f"HTTP {response.status_code}: {(await response.aread())!r}"
                    return
                # Read to the end (the server closes after [DONE]): leaving the line iterator
                # early would strand its async generator.
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    stamp = time.perf_counter()
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        trace.error = str(chunk["error"].get("message", chunk["error"]))
                    for choice in chunk.get("choices", ()):
                        # Tokens per chunk are filled in later (metrics.align_http).
                        trace.arrivals.append((stamp, 0))
                        trace.pieces.append(choice["text"])
                    if chunk.get("usage"):
                        trace.reported_tokens = chunk["usage"]["completion_tokens"]
        except httpx.HTTPError as error:
            trace.error = f"{type(error).__name__}: {error}"

    async def _aclose(self) -> None:
        await self._client.aclose()
