"""Soak: mixed load through the whole stack for minutes, with clients that give up at random
points and one allocator crash, then checks that nothing leaked and nothing grew.

    make soak                                  # 10 minutes; rewrites docs/reliability.md's
                                               # `## Soak` and docs/img/soak_memory.png
    .venv/bin/python -m bench.soak --minutes 2
    .venv/bin/python -m bench.soak --quick     # 20 s smoke run; writes nothing unless told

The stack (stack.py): redis-server, an allocator journaling to it, one executor on the
embedded model, a gateway. The load (bench/load/impatient_clients.py, which the client-storm test
uses too): `--concurrency` clients at a time, gRPC and HTTP, streamed and whole, greedy and
sampled, a third of them giving up mid-way. Before the load, each prompt's greedy answer comes
from the in-process engine, and the gateway's undisturbed answer is checked against it. At half
time the allocator is killed with SIGKILL and restarted on the same port and Redis. Memory of
every process is sampled throughout (bench.memory).

Afterwards: every count that must drain is zero (used blocks, sequences, executor and gateway
requests), `Audit` is clean, no request failed, every greedy answer (whole or the part that
arrived) is the engine's, every sampled one has its length, and no process's memory grew by 5 %
from the 20-40 % window to the last 20 %. Exit status 1 when any of that fails.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from tqdm import tqdm

from bench.load.impatient_clients import (Answer, ImpatientClients, Plan, Result, draw_plans,
                                          wrong_answer)
from bench.load.stack_leftovers import drained, gateway_outcomes
from bench.report import add_output_flags, command_line, output_paths
from bench.soak.memory import RssSampler, growth, sample_interval
from bench.soak.plot import write_plot
from bench.soak.report import SoakResults, section, terminal_report, write_section
from bench.soak.stack import SoakStack
from pagedserve.supervisor.service_process import pagedctl_audit

QUICK_MINUTES = 0.3
PAGE = "reliability.md"   # under docs/: the soak is a reliability check, not a benchmark
GREEDY_TOKENS = 32
SAMPLED_SHARE = 0.25
PROMPTS = [list(f"soak {i}: the {topic} went on for ten minutes".encode()) for i, topic in
           enumerate(["stream", "cache", "block", "socket", "tenant", "request", "river",
                      "engine"])]
# About a third give up; the rest read to the end.
MIX = {"grpc-complete": 0.22, "http-stream-complete": 0.22, "http-whole-complete": 0.22,
       "grpc-cancel-after-delay": 0.06, "grpc-cancel-after-k": 0.08,
       "http-stream-drop-after-delay": 0.06, "http-stream-drop-after-k": 0.08,
       "http-whole-timeout": 0.06}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=None,
                        help=f"how long the load runs (default 10; {QUICK_MINUTES} with --quick)")
    parser.add_argument("--concurrency", type=int, default=24, help="clients at a time")
    parser.add_argument("--seed", type=int, default=20250101, help="seeds the load's draw")
    add_output_flags(parser, PAGE)
    args = parser.parse_args(argv)
    if args.minutes is None:
        args.minutes = QUICK_MINUTES if args.quick else 10.0
    if not args.minutes > 0:
        parser.error("--minutes must be positive")
    args.out_md, args.out_png = output_paths(args, "memory.png", PAGE)
    return args


def engine_answers(model_dir: Path) -> list[list[int]]:
    """Each prompt's greedy tokens from the in-process engine: the reference."""
    from allocator_service.local_block_allocator import LocalBlockAllocator
    from executor_service.engine.build import EngineOptions, build_engine
    from executor_service.engine.offline import generate
    from pagedserve.protocol.sampling_params import SamplingParams

    engine = build_engine(model_dir, EngineOptions(num_blocks=64), LocalBlockAllocator())
    completions = generate(engine, PROMPTS, SamplingParams(
        temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True))
    return [completion.choices[0] for completion in completions]


class Soak:
    """One run: the load, the allocator restart at half time, the progress bar."""

    def __init__(self, stack: SoakStack, args: argparse.Namespace) -> None:
        self.stack, self.args = stack, args
        self.duration_s = args.minutes * 60
        self.restarts: list[tuple[float, float]] = []
        self.allocator_state = "up"
        self.counts = {"done": 0, "gave up": 0, "failed": 0}
        self.began = 0.0

    async def check_references(self, engine: list[list[int]]
                               ) -> tuple[list[Answer], list[str]]:
        """The gateway's undisturbed greedy answers, each compared with the engine's; the
        answers keep the engine's tokens and the gateway's text (HTTP has no token ids)."""
        clients = self._clients()
        try:
            served = [await clients.serve(Plan("grpc-complete", prompt, True, GREEDY_TOKENS,
                                               0, 0)) for prompt in range(len(PROMPTS))]
        finally:
            await clients.aclose()
        mismatches = [f"prompt {index}: gateway {result.token_ids or result.error!r} != "
                      f"engine {tokens}" for index, (result, tokens) in
                      enumerate(zip(served, engine)) if result.token_ids != tokens]
        return [Answer(tokens, result.text) for result, tokens in zip(served, engine)], mismatches

    def run(self) -> list[Result]:
        self.began = time.monotonic()
        stop = threading.Event()
        restarter = threading.Thread(target=self._restart_at_half_time, args=(stop,),
                                     name="allocator-restart", daemon=True)
        restarter.start()
        try:
            return asyncio.run(self._load())
        finally:
            stop.set()
            restarter.join()

    def _restart_at_half_time(self, stop: threading.Event) -> None:
        if stop.wait(self.duration_s / 2):
            return
        self.allocator_state = "restarting"
        at = time.monotonic() - self.began
        away = self.stack.restart_allocator()
        self.restarts.append((at, away))
        self.allocator_state = f"restarted ({away:.1f} s)"

    async def _load(self) -> list[Result]:
        clients = self._clients()
        plans = draw_plans(random.Random(self.args.seed), MIX, len(PROMPTS), GREEDY_TOKENS,
                           SAMPLED_SHARE)
        with tqdm(total=round(self.duration_s), unit="s", desc="soak", mininterval=1.0,
                  bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt} s {postfix}") as progress:
            ticker = asyncio.create_task(self._tick(progress))
            try:
                return await clients.run(plans, until=self.began + self.duration_s,
                                         on_result=self._count)
            finally:
                ticker.cancel()
                await clients.aclose()

    async def _tick(self, progress: tqdm) -> None:
        while True:
            progress.n = min(progress.total, time.monotonic() - self.began)
            progress.set_postfix(self.counts, allocator=self.allocator_state, refresh=False)
            progress.refresh()
            await asyncio.sleep(1.0)

    def _count(self, result: Result) -> None:
        self.counts["done"] += 1
        self.counts["gave up"] += result.outcome.startswith("gave-up")
        self.counts["failed"] += result.outcome == "error"

    def _clients(self) -> ImpatientClients:
        gateway = self.stack.gateway
        return ImpatientClients(gateway.target, gateway.http_url, PROMPTS,
                                self.args.concurrency)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from executor_service.model.embedded import embedded_model_dir

    model_dir = embedded_model_dir()
    engine = engine_answers(model_dir)
    with tempfile.TemporaryDirectory(prefix="pagedserve-soak-") as data_dir, \
            SoakStack(Path(data_dir), model_dir.parents[1]) as stack:
        print(", ".join(f"{name} pid {pid}" for name, pid in stack.pids().items()),
              file=sys.stderr)
        soak = Soak(stack, args)
        answers, reference_mismatches = asyncio.run(soak.check_references(engine))
        sampler = RssSampler(stack.pids, sample_interval(soak.duration_s))
        sampler.start()
        try:
            results = soak.run()
        finally:
            memory = sampler.stop()
        load_s = max(result.ended_at for result in results) - soak.began if results else 0.0
        leftovers = drained(stack.allocator_target, stack.gateway.http_url)
        audit = pagedctl_audit(stack.allocator)
        outcomes = gateway_outcomes(stack.gateway.http_url)
    r = SoakResults(
        command=command_line(), minutes=args.minutes, concurrency=args.concurrency,
        kinds=list(MIX), results=results, load_s=max(load_s, 1e-9), restarts=soak.restarts,
        restarts_planned=1, reference_mismatches=reference_mismatches,
        wrong_answers=[wrong for result in results if (wrong := wrong_answer(result, answers))],
        leftovers=leftovers, audit=audit.stdout + audit.stderr,
        audit_clean=audit.returncode == 0 and "no violations" in audit.stdout,
        gateway_outcomes=outcomes, memory=memory, growth=growth(memory))
    print(terminal_report(r))
    for problem in (r.reference_mismatches + r.wrong_answers[:10]
                    + [f"{f.plan}: {f.error}" for f in r.failed[:10]]):
        print(f"  {problem}")
    if not r.audit_clean:
        print(r.audit)
    if args.out_png is not None:
        write_plot(memory, soak.restarts, args.out_png)
        print(f"plot: {args.out_png}")
    if args.out_md is not None:
        write_section(args.out_md, section(r, args.out_png, args.out_md))
        print(f"results: {args.out_md} (## Soak)")
    print("soak passed" if r.passed else "soak FAILED: see the rows marked NO")
    return 0 if r.passed else 1


if __name__ == "__main__":
    sys.exit(main())
