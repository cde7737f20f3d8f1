"""What the serving benchmark records of each request and each run, and the metrics computed
from it, the same way for every contender.

Every client stamps each piece of a stream with `time.perf_counter()` the moment it arrives: an
engine step's output (in-process), a gRPC message, an HTTP server-sent event. From those:

    TTFT  time to first token: the first piece that carries a token, minus when the request was
          sent (after it waited for a concurrency slot, as vLLM's benchmark_serving measures)
    TPOT  time per output token, per request: (last token − first token) / (output tokens − 1)
    ITL   inter-token latency, one sample per token after a request's first: the gap since the
          previous piece, shared evenly among the tokens the piece carries (so a piece with k
          tokens after a gap g gives k samples of g / k); tokens that came with the first token
          count 0. A request's ITL samples thus average to its TPOT, and one sample stands for
          every token, however the stream grouped them (sglang's bench_serving does the same).

Pieces and tokens: an engine step and a gRPC delta carry token ids, counted directly. An HTTP
chunk carries text only, and the gateway sends no chunk for a token whose text it holds back
(an incomplete UTF-8 character): the next chunk brings it. The tokens of each HTTP chunk are
therefore read off the same request's gRPC deltas, which come from the same detokenizer one
token per message (`align_http`): a gRPC delta with text (or the last) ends a chunk. The HTTP
texts must equal the gRPC ones for that, which the sanity check requires anyway.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench.report import percentile


@dataclass(slots=True)
class RequestTrace:
    """One request as its client saw it."""
    # perf_counter when the request went out.
    sent_s: float = 0.0
    # Each piece of the stream: (perf_counter on arrival, tokens it carried).
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    # Each piece's text (gRPC and HTTP; empty in-process).
    pieces: list[str] = field(default_factory=list)
    # Generated token ids (in-process and gRPC; HTTP sends text).
    token_ids: list[int] = field(default_factory=list)
    # Tokens the server says it generated (usage.completion_tokens; in-process: counted).
    reported_tokens: int = 0
    error: str = ""

    @property
    def num_tokens(self) -> int:
        return sum(count for _, count in self.arrivals)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def _token_arrivals(self) -> list[tuple[float, int]]:
        return [(at, count) for at, count in self.arrivals if count]

    @property
    def ttft_s(self) -> float | None:
        arrivals = self._token_arrivals()
        return arrivals[0][0] - self.sent_s if arrivals else None

    @property
    def tpot_s(self) -> float | None:
        arrivals = self._token_arrivals()
        if self.num_tokens < 2:
            return None
        return (arrivals[-1][0] - arrivals[0][0]) / (self.num_tokens - 1)

    def itls_s(self) -> list[float]:
        arrivals = self._token_arrivals()
        if not arrivals:
            return []
        gaps = [0.0] * (arrivals[0][1] - 1)
        for (before, _), (at, count) in zip(arrivals, arrivals[1:]):
            gaps += [(at - before) / count] * count
        return gaps


@dataclass(slots=True)
class Run:
    """One contender serving every request once at one request rate."""
    contender: str
    rate: float
    round_index: int
    # perf_counter at the start (the first arrival) and at the last token.
    start_s: float
    end_s: float
    traces: list[RequestTrace]
    # CPU seconds each process used during the run: "benchmark" (this process; for the
    # in-process engine, the engine itself) and, through the stack, each service.
    cpu_s: dict[str, float] = field(default_factory=dict)
    # HTTP requests whose chunks could not be matched to gRPC's deltas (counted one token per
    # chunk, the rest on the last); 0 elsewhere.
    unaligned: int = 0

    @property
    def wall_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def completed(self) -> int:
        return sum(not trace.error for trace in self.traces)

    @property
    def output_tokens(self) -> int:
        return sum(trace.num_tokens for trace in self.traces)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def requests_per_s(self) -> float:
        return self.completed / self.wall_s

    def ttfts_s(self) -> list[float]:
        return [t.ttft_s for t in self.traces if t.ttft_s is not None]

    def tpots_s(self) -> list[float]:
        return [t.tpot_s for t in self.traces if t.tpot_s is not None]

    def itls_s(self) -> list[float]:
        return [gap for trace in self.traces for gap in trace.itls_s()]

    def cpu_us_per_token(self, process: str) -> float | None:
        seconds = self.cpu_s.get(process)
        return None if seconds is None else seconds / self.output_tokens * 1e6


def summary_ms(samples_s: list[float]) -> dict[str, float]:
    """mean, median and p99 (nearest rank) in milliseconds; NaN without samples."""
    if not samples_s:
        return {"mean": float("nan"), "median": float("nan"), "p99": float("nan")}
    return {"mean": statistics.fmean(samples_s) * 1e3,
            "median": statistics.median(samples_s) * 1e3,
            "p99": percentile(samples_s, 99) * 1e3}


def align_http(trace: RequestTrace, reference: RequestTrace) -> bool:
    """Fills in the tokens each of `trace`'s HTTP chunks carried, from `reference`, the same
    request through gRPC. False (and one token per chunk, the rest on the last) when the chunk
    texts are not the gRPC texts grouped as the gateway groups them."""
    counts, texts, pending = [], [], 0
    last = len(reference.arrivals) - 1
    for index, ((_, count), text) in enumerate(zip(reference.arrivals, reference.pieces)):
        pending += count
        if text or index == last:
            counts.append(pending)
            texts.append(text)
            pending = 0
    times = [at for at, _ in trace.arrivals]
    if texts == trace.pieces:
        trace.arrivals = list(zip(times, counts))
        return True
    if times:
        counts = [1] * len(times)
        counts[-1] = max(1, trace.reported_tokens - (len(times) - 1))
        trace.arrivals = list(zip(times, counts))
    return False
