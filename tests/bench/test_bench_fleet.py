"""The fleet benchmark's parts, against a real allocator service: a simulated executor records a
Step stream, and a replay of several executors from it drives a fresh allocator exactly as the
executor did (every answer equal, byte for byte), leaving its pools consistent. No timings are
asserted; counts are."""
from __future__ import annotations

import asyncio
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import grpc

from bench.fleet import profile
from bench.fleet.replay import replay, replayed_executor_id, stall_bursts
from bench.fleet.slack import slack_of
from bench.fleet.step_stream import RecordedStep, StepStream
from bench.fleet.workload import FleetWorkload, draw_requests
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.common.allocator_shards import balanced_owners
from pagedserve.supervisor.service_process import AllocatorProcess
from tests.support.allocator_group import Shards
from tests.support.bench_runs import BENCH_ENV

ROOT = Path(__file__).resolve().parents[2]

SMALL = FleetWorkload(target_running=16, iteration_s=0.02)


def test_the_workload_keeps_the_batch_full_by_littles_law():
    # 16 sequences, each living mean-output-tokens iterations of 20 ms.
    lifetime = SMALL.mean_output_tokens * SMALL.iteration_s
    assert math.isclose(SMALL.arrival_rate * SMALL.mean_sequences * lifetime, 16)
    requests = draw_requests(SMALL, 200.0, seed=1)
    assert requests == draw_requests(SMALL, 200.0, seed=1)
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    later = [r for r in requests if r.arrival_s > 0]
    assert math.isclose(len(later) / 200.0, SMALL.arrival_rate, rel_tol=0.2)
    assert 0.02 < statistics.fmean(r.n > 1 for r in requests) < 0.1
    assert 0.02 < statistics.fmean(r.cancel_after is not None for r in requests) < 0.1
    assert all(r.cancel_after is None or 0 < r.cancel_after < r.max_tokens for r in requests)


def audit(target: str) -> list[str]:
    with grpc.insecure_channel(target) as channel:
        reply = pb_grpc.AllocatorAdminStub(channel).Audit(pb.AuditRequest())
    assert reply.num_pools > 0
    return list(reply.violations)


def test_a_recorded_stream_replays_exactly_for_several_executors(tmp_path, capsys):
    stream_path = tmp_path / "sim.stream"
    with AllocatorProcess("--lease-ttl", "600") as allocator:
        run = subprocess.run(
            [sys.executable, "-m", "bench.fleet.sim_executor", "--target", allocator.target,
             "--executor-id", "sim-0", "--seconds", "4", "--running", "16", "--num-blocks",
             "512", "--step-interval", "4", "--out", str(stream_path)],
            capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        summary = json.loads(run.stdout.strip().splitlines()[-1])
        assert audit(allocator.target) == []
    stream = StepStream.load(stream_path)
    assert summary["iterations"] > 50 and summary["steps"] == len(stream.steps) > 5
    # Coalesced: fewer Steps than iterations.
    assert summary["steps"] < summary["iterations"]
    assert [s.offset_s for s in stream.steps] == sorted(s.offset_s for s in stream.steps)

    with AllocatorProcess("--lease-ttl", "600") as allocator:
        result = asyncio.run(replay([allocator.target], [stream], 3, warmup_s=0.0,
                                    measure_s=6.0, spread_s=0.5,
                                    allocator_pids=[allocator.process.pid]))
        problems = audit(allocator.target)
    assert result.mismatches == 0
    assert result.channel_executors == 3   # the allocator's Step channel, as executors use it
    assert result.steps == 3 * len(stream.steps)
    assert result.ops == 3 * sum(step.num_ops for step in stream.steps)
    assert len(result.latencies_ms) == result.steps
    assert result.allocator_cpu_s is not None and result.allocator_cpu_s > 0
    assert result.stolen_s is not None and result.stolen_s >= 0  # /proc/stat's steal
    assert problems == []

    # The Step RPC, still there to be measured, answers the same bytes.
    with AllocatorProcess("--lease-ttl", "600") as allocator:
        over_rpc = asyncio.run(replay([allocator.target], [stream], 1, warmup_s=0.0,
                                      measure_s=6.0, spread_s=0.0, transport="grpc"))
    assert (over_rpc.mismatches, over_rpc.channel_executors) == (0, 0)
    assert over_rpc.steps == len(stream.steps)

    # An allocator group: replayed executor k registers with the shard its index gives it,
    # which puts 3 on each of 2 shards whatever their ports.
    executors = 6
    with Shards.start(2, "--lease-ttl", "600") as shards:
        result = asyncio.run(replay(shards.addresses, [stream], executors, warmup_s=0.0,
                                    measure_s=6.0, spread_s=0.5,
                                    allocator_pids=[p.process.pid for p in shards.processes]))
        listed = [sorted(shards.epochs(index)) for index in range(2)]
        problems = [audit(address) for address in shards.addresses]
    owners = balanced_owners(executors, shards.addresses)
    assert listed == [sorted(replayed_executor_id(k) for k in range(executors)
                             if owners[k] == address) for address in shards.addresses]
    assert result.shard_executors == [len(ids) for ids in listed] == [3, 3]
    assert result.mismatches == 0 and result.steps == executors * len(stream.steps)
    assert len(result.shard_cpu_s) == 2 and result.allocator_cpu_s == sum(result.shard_cpu_s)
    assert problems == [[], []]

    # The in-process profile plays the same Step path, as exactly, stage by stage.
    assert profile.main([str(stream_path), "--copies", "2"]) == 0
    table = capsys.readouterr().out
    assert "answers differing from the recording: 0" in table
    for stage in (*profile.WIRE_STAGES, "garbage collection", "total in process"):
        assert stage in table
    # Through the wire reader (the Step channel's) and through protobuf (the Step RPC's).
    for protobuf, stages in ((False, profile.WIRE_STAGES), (True, profile.PROTOBUF_STAGES)):
        times = profile.play([stream], 2, collect=False, protobuf=protobuf)
        assert times.steps == 2 * len(stream.steps) and times.mismatches == 0
        assert all((times.seconds[stage] > 0) == (stage in stages) for stage in profile.STAGES)
        assert len(times.per_step_s) == times.steps
    assert profile.cost_per_executor_second([stream_path], copies=2) > 0


def test_slack_is_read_from_the_overlapped_steps_only():
    stream = StepStream("sim-0", 8, 4, "m", 0.005, 1.0)
    for slack_s in (0.0, 0.001, 0.0, 0.004, 0.0015, 0.003):  # 0: a Step the pass waited for
        stream.steps.append(RecordedStep(0.0, slack_s, 0.0005, 1, b"", b""))
    slack = slack_of([stream])
    assert slack.overlapped == 4
    assert (slack.p10_s, slack.p50_s) == (0.001, 0.0015)  # nearest rank
    assert slack.little == 0.5  # 1 and 1.5 ms are under 2
    assert slack_of([StepStream("sim-1", 8, 4, "m", 0.005, 1.0)]).overlapped == 0


def test_stalls_within_a_tenth_of_a_second_are_one_burst():
    assert stall_bursts([]) == 0
    assert stall_bursts([4.573, 4.589, 4.66, 4.74, 12.64, 12.65, 19.78]) == 3
    assert stall_bursts([0.5, 0.3, 0.35]) == 2  # in any order


def test_a_replay_against_another_pool_size_is_caught(tmp_path):
    """The byte-for-byte check can fail: the same ops on blocks of another size get other
    block tables."""
    stream_path = tmp_path / "sim.stream"
    with AllocatorProcess("--lease-ttl", "600") as allocator:
        subprocess.run(
            [sys.executable, "-m", "bench.fleet.sim_executor", "--target", allocator.target,
             "--executor-id", "sim-0", "--seconds", "2", "--running", "8", "--num-blocks",
             "256", "--out", str(stream_path)], check=True, capture_output=True, timeout=120)
    stream = StepStream.load(stream_path)
    stream.block_size *= 2
    with AllocatorProcess("--lease-ttl", "600") as allocator:
        result = asyncio.run(replay([allocator.target], [stream], 1, warmup_s=0.0,
                                    measure_s=4.0, spread_s=0.0))
    assert result.steps == len(stream.steps)
    assert result.mismatches > 0


def test_the_quick_run_prints_its_table_and_writes_nothing_by_default(tmp_path):
    before = (ROOT / "docs" / "benchmarks.md").read_bytes()
    run = subprocess.run(
        [sys.executable, "-m", "bench.fleet", "--quick", "--iterations-ms", "20", "--executors",
         "2", "--streams", "2", "--recorders", "1", "--running", "32", "--stores", "memory",
         "--baseline-interval", "0", "--group-shards", "2", "--group-executors", "3"],
        cwd=tmp_path, env=BENCH_ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for metric in ("20 ms: simulated executors (live), Steps/s and ops per Step",
                   "20 ms: these Steps' path in one process, collector off, per "
                   "executor-second (the machine's speed)",
                   "20 ms: live: iterations run, of as many as keep pace",
                   "20 ms, memory: allocator CPU per executor-second",
                   "20 ms, memory: largest N replayed with 0 stalls",
                   "20 ms, memory, 2 shards, 3 executors: executors per shard",
                   "20 ms, memory, one allocator at 2 executors, right before and right after",
                   "20 ms, memory, 2 shards, 3 executors: capacity over one allocator's at "
                   "this N"):
        assert metric in run.stdout
    assert (ROOT / "docs" / "benchmarks.md").read_bytes() == before
    assert list(tmp_path.iterdir()) == []
