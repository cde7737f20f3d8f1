"""pagedctl against the real allocator: the table and --json output of every command, exact."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from allocator_service.core.block_hash import chain_hash, root_hash
from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.supervisor.service_process import REPO_ROOT, AllocatorProcess, hermetic_env
from tests.support.allocator_wire import (TOKEN, Executor, allocate, append, free, pool_stats,
                                          register)

pytestmark = pytest.mark.timeout(60)


def pagedctl(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagedserve.cli.pagedctl", "--target", target, *args],
        cwd=REPO_ROOT, env=hermetic_env({"PYTHONIOENCODING": "utf-8"}), capture_output=True,
        text=True, encoding="utf-8", timeout=60)


def table_row(output: str, first_cell: str) -> list[str]:
    """The cells of the table row starting with `first_cell` (cells hold no spaces here)."""
    (row,) = [line.split() for line in output.splitlines() if line.split()[:1] == [first_cell]]
    return row


def as_int(message: dict, key: str) -> int:
    """An integer field of pagedctl's JSON, which prints every field as a JSON number."""
    value = message[key]
    assert isinstance(value, int), f"{key} is {value!r}, not a JSON number"
    return value


CTL = "pagedctl-pool"


def audited(admin: pb_grpc.AllocatorAdminStub, command):
    """`command()` run between two Audits that agree, and that Audit: other tests' pools on
    this allocator come and go (their leases lapse), and pagedctl must be compared with the
    pools as they were while it ran."""
    for _ in range(5):
        before = admin.Audit(pb.AuditRequest(), timeout=5)
        done = command()
        after = admin.Audit(pb.AuditRequest(), timeout=5)
        if (before.num_pools, before.num_blocks) == (after.num_pools, after.num_blocks):
            return before, done
    raise AssertionError("the allocator's pools changed during every pagedctl audit")


@pytest.fixture(scope="class")
def ctl_pool(stub: pb_grpc.AllocatorStub) -> Executor:
    """8 blocks of 4: ctl-seq holds 0 1 2 (10 tokens); ctl-gone's cached blocks 3 4 were freed.

        blocks   0     1     2      3            4            5     6     7
        state    used  used  used   cached-free  cached-free  free  free  free
        free list (taken first → last): 5 6 7 4 3
    """
    ex = register(stub, CTL, num_blocks=8, block_size=4, address="10.0.0.7:50053",
                  model_fingerprint="llama-3-8b/fp16/bs4", executor_index=3)
    ex.heartbeat(num_waiting=2, num_running=1)
    ex.step(allocate("ctl-seq", list(range(1, 11))), allocate("ctl-gone", list(range(101, 110))))
    ex.step(append("ctl-seq", num_computed_tokens=10), append("ctl-gone", num_computed_tokens=9))
    ex.step(free("ctl-gone"))
    return ex


@pytest.mark.usefixtures("ctl_pool")
class TestPagedctl:
    def test_stats_prints_the_pool_row_and_refcount_histogram(
            self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "stats", "--executor", CTL)
        assert done.returncode == 0, done.stderr
        expected = ["8", "3", "2", "3", "37.50", "0.00", "10", "12", "1"]
        assert table_row(done.stdout, CTL) == [CTL, *expected]
        assert table_row(done.stdout, "total") == ["total", *expected]
        assert done.stdout.splitlines()[-2:] == ["refcount histogram (refcount: blocks): 1: 3",
                                                 "state in memory (not durable)"]

    def test_stats_json(self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "--json", "stats", "--executor", CTL)
        assert done.returncode == 0, done.stderr
        (pool,) = json.loads(done.stdout)["pools"]
        assert pool["executor_id"] == CTL
        assert {key: as_int(pool, key) for key in (
            "num_blocks", "num_used_blocks", "num_cached_free_blocks", "num_free_blocks",
            "tokens_stored", "slots_allocated", "num_sequences", "prefix_query_tokens",
            "prefix_hit_tokens", "block_size")} == {
            "num_blocks": 8, "num_used_blocks": 3, "num_cached_free_blocks": 2,
            "num_free_blocks": 3, "tokens_stored": 10, "slots_allocated": 12,
            "num_sequences": 1, "prefix_query_tokens": 19, "prefix_hit_tokens": 0,
            "block_size": 4}
        assert pool["usage_percent"] == 37.5

    def test_executors_prints_index_lease_load_and_last_step(
            self, server: AllocatorProcess, ctl_pool: Executor) -> None:
        done = pagedctl(server.target, "executors")
        assert done.returncode == 0, done.stderr
        row = table_row(done.stdout, CTL)
        assert row[:6] + row[7:] == [CTL, "3", "10.0.0.7:50053", str(ctl_pool.epoch), "8", "4",
                                     "2", "1", "3", "llama-3-8b/fp16/bs4"]
        assert 0 < float(row[6]) <= 600

        done = pagedctl(server.target, "--json", "executors")
        (info,) = [e for e in json.loads(done.stdout)["executors"] if e["executor_id"] == CTL]
        assert (info["address"], info["model_fingerprint"]) == ("10.0.0.7:50053",
                                                               "llama-3-8b/fp16/bs4")
        assert [as_int(info, key) for key in ("epoch", "num_blocks", "block_size", "num_waiting",
                                              "num_running", "last_step_id", "executor_index")
                ] == [ctl_pool.epoch, 8, 4, 2, 1, 3, 3]

    def test_sequences_lists_the_live_sequence(self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "sequences", "--executor", CTL)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].split() == ["executor", "sequence", "tokens", "blocks", "cached",
                                    "computed"]
        assert [line.split() for line in lines[2:]] == [[CTL, "ctl-seq", "10", "3", "0", "10"]]

        done = pagedctl(server.target, "--json", "sequences", "--executor", CTL)
        (seq,) = json.loads(done.stdout)["sequences"]
        assert (seq["executor_id"], seq["seq_id"]) == (CTL, "ctl-seq")
        assert [as_int(seq, key) for key in ("num_tokens", "num_blocks", "num_cached_tokens",
                                             "num_computed_tokens")] == [10, 3, 0, 10]

    def test_table_prints_the_exact_block_ids(self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "table", "ctl-seq")
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"sequence ctl-seq on {CTL}: 10 tokens in 3 blocks of 4\n0 1 2\n"

        table = json.loads(pagedctl(server.target, "--json", "table", "ctl-seq").stdout)
        assert table["block_ids"] == [0, 1, 2]
        assert (table["executor_id"], as_int(table, "num_tokens"), table["block_size"]) == (
            CTL, 10, 4)

    def test_table_of_unknown_sequence_exits_2_with_not_found(
            self, server: AllocatorProcess) -> None:
        done = pagedctl(server.target, "table", "no-such-seq")
        assert done.returncode == 2
        assert done.stderr == "pagedctl: NOT_FOUND: no pool holds sequence 'no-such-seq'\n"

    def test_blocks_prints_every_block_and_the_free_list(self, server: AllocatorProcess,
                                                         admin: pb_grpc.AllocatorAdminStub) -> None:
        dump = admin.DumpBlocks(pb.DumpBlocksRequest(executor_id=CTL), timeout=5)
        hashes = [b.block_hash.hex()[:16] for b in dump.blocks]
        assert [bool(h) for h in hashes] == [True, True, False, True, True, False, False, False]
        done = pagedctl(server.target, "blocks", CTL)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].split() == ["block", "state", "refs", "tokens", "hash"]
        assert [line.split() for line in lines[2:10]] == [
            ["0", "used", "1", "4", hashes[0]],
            ["1", "used", "1", "4", hashes[1]],
            ["2", "used", "1", "2"],
            ["3", "cached-free", "0", "0", hashes[3]],
            ["4", "cached-free", "0", "0", hashes[4]],
            ["5", "free", "0", "0"],
            ["6", "free", "0", "0"],
            ["7", "free", "0", "0"],
        ]
        assert lines[10:] == ["free list (taken first → last): 5 6 7 4 3"]

        dumped = json.loads(pagedctl(server.target, "--json", "blocks", CTL).stdout)
        assert [as_int(b, "block_id") for b in dumped["blocks"]] == list(range(8))
        assert [b["state"] for b in dumped["blocks"]] == ["BLOCK_STATE_USED"] * 3 + [
            "BLOCK_STATE_CACHED_FREE"] * 2 + ["BLOCK_STATE_FREE"] * 3
        assert dumped["blocks"][0]["block_hash"] == dump.blocks[0].block_hash.hex()
        assert dumped["blocks"][0]["block_hash"].startswith(hashes[0])  # the table's prefix
        assert dumped["blocks"][5]["block_hash"] == ""
        assert dumped["free_list"] == [5, 6, 7, 4, 3]

    def test_blocks_png_writes_a_readable_picture(self, server: AllocatorProcess,
                                                  tmp_path: Path) -> None:
        path = tmp_path / "pool.png"
        done = pagedctl(server.target, "blocks", CTL, "--png", str(path))
        assert done.returncode == 0, done.stderr
        # The picture replaces the listing: one summary line, not a row per block.
        assert done.stdout == (f"wrote {path}: {CTL}, 8 blocks (3 free, 2 cached-free, "
                               "3 used)\n")
        summary = json.loads(pagedctl(server.target, "blocks", CTL, "--png", str(path),
                                      "--json").stdout)
        assert summary == {"png": str(path), "executor_id": CTL, "num_blocks": 8,
                           "blocks_by_state": {"free": 3, "cached-free": 2, "used": 3}}
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as image:
            image.load()
            assert image.format == "PNG"
            assert image.width > 0 and image.height > 0

    def test_audit_exits_0_and_reports_no_violations(self, server: AllocatorProcess,
                                                     admin: pb_grpc.AllocatorAdminStub) -> None:
        audit, done = audited(admin, lambda: pagedctl(server.target, "audit"))
        assert list(audit.violations) == []
        assert done.returncode == 0, done.stderr
        assert done.stdout == (f"ok: {audit.num_pools} pools, {audit.num_blocks} blocks, "
                               "no violations\n")
        audit, done = audited(admin, lambda: pagedctl(server.target, "--json", "audit"))
        report = json.loads(done.stdout)
        assert (report.get("violations", []), report["num_pools"], as_int(report, "num_blocks")) \
            == ([], audit.num_pools, audit.num_blocks)

    def test_reset_prefix_cache_drops_the_pools_entries(self, server: AllocatorProcess,
                                                         stub: pb_grpc.AllocatorStub,
                                                         admin: pb_grpc.AllocatorAdminStub) -> None:
        ex = register(stub, "pagedctl-reset", num_blocks=4, block_size=4)
        prompt = list(range(1, 10))
        ex.step(allocate("r", prompt))
        ex.step(append("r", num_computed_tokens=9))  # blocks 0 and 1 cached
        done = pagedctl(server.target, "--json", "reset-prefix-cache", "--executor", ex.executor_id)
        assert done.returncode == 0, done.stderr
        assert as_int(json.loads(done.stdout), "num_entries_dropped") == 2
        done = pagedctl(server.target, "reset-prefix-cache", "--executor", ex.executor_id)
        assert done.stdout == "dropped 0 prefix-cache entries\n"
        (match,) = [m for m in stub.MatchPrefix(pb.MatchPrefixRequest(token_ids=prompt),
                                                timeout=5).executors
                    if m.executor_id == ex.executor_id]
        assert match.num_cached_tokens == 0
        assert pool_stats(admin, CTL).num_cached_free_blocks == 2  # other pools untouched


def test_pagedctl_json_keeps_fields_whose_value_is_zero(server: AllocatorProcess,
                                                       stub: pb_grpc.AllocatorStub) -> None:
    """`--json` is for scripts: block 0 must carry its block_id and an idle pool its counters.

    proto3 JSON leaves zero values out unless asked; pagedctl prints every field, zeros included.
    """
    register(stub, "json-zero", num_blocks=2, block_size=4)
    dumped = json.loads(pagedctl(server.target, "--json", "blocks", "json-zero").stdout)
    missing_in_block_0 = [key for key in ("block_id", "ref_count", "num_tokens")
                          if key not in dumped["blocks"][0]]
    (pool,) = json.loads(pagedctl(server.target, "--json", "stats", "--executor",
                                  "json-zero").stdout)["pools"]
    missing_in_stats = [key for key in ("num_used_blocks", "num_cached_free_blocks",
                                        "usage_percent", "num_sequences") if key not in pool]
    assert (missing_in_block_0, missing_in_stats) == ([], [])


def test_pagedctl_needs_the_token_of_a_protected_allocator(auth_server: AllocatorProcess) -> None:
    done = pagedctl(auth_server.target, "stats")
    assert done.returncode == 2
    assert done.stderr.startswith(
        "pagedctl: UNAUTHENTICATED: missing 'authorization: Bearer <token>' metadata")
    assert pagedctl(auth_server.target, "--token", "wrong", "stats").stderr.startswith(
        "pagedctl: UNAUTHENTICATED: wrong bearer token")
    done = pagedctl(auth_server.target, "--token", TOKEN, "audit")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: ")


def test_events_prints_every_event_in_order_and_from_a_sequence_number(
        allocator: AllocatorProcess) -> None:
    ex = register(pb_grpc.AllocatorStub(allocator.channel()), "ev", num_blocks=4, block_size=4,
                  model_fingerprint="m")
    ex.step(allocate("a", list(range(1, 10))))
    ex.step(append("a", num_computed_tokens=9))  # blocks 0 and 1 enter the prefix cache
    h0 = chain_hash(root_hash("m", ""), [1, 2, 3, 4])
    h1 = chain_hash(h0, [5, 6, 7, 8])
    done = pagedctl(allocator.target, "events")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "#1 PoolReset    ev registered (4 blocks of 4)",
        f"#2 BlockStored  ev block 0 hash {h0.hex()[:16]} parent "
        f"{root_hash('m', '').hex()[:16]} tokens [1, 2, 3, 4]",
        f"#3 BlockStored  ev block 1 hash {h1.hex()[:16]} parent {h0.hex()[:16]} "
        "tokens [5, 6, 7, 8]",
    ]
    tail = pagedctl(allocator.target, "--json", "events", "--from", "3").stdout.splitlines()
    assert [(e["seq"], e["type"], e["block_id"], e["token_ids"])
            for e in map(json.loads, tail)] == [
        (3, "KV_EVENT_TYPE_BLOCK_STORED", 1, [5, 6, 7, 8])]
    (stored,) = map(json.loads, tail)
    assert (stored["block_hash"], stored["parent_block_hash"]) == (h1.hex(), h0.hex())


def test_events_follow_prints_new_events_until_interrupted(allocator: AllocatorProcess) -> None:
    follower = subprocess.Popen(
        [sys.executable, "-m", "pagedserve.cli.pagedctl", "--target", allocator.target,
         "events", "--follow"], cwd=REPO_ROOT, env=hermetic_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # the follower is waiting on an empty stream
        register(pb_grpc.AllocatorStub(allocator.channel()), "late", num_blocks=2, block_size=4)
        assert follower.stdout is not None
        assert follower.stdout.readline() == "#1 PoolReset    late registered (2 blocks of 4)\n"
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=10) == 0
    finally:
        follower.kill()
        follower.wait()


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_options_go_before_or_after_the_command(
        where: str, auth_server: AllocatorProcess) -> None:
    """`pagedctl --json stats` and `pagedctl stats --json` (and --target, --token, --timeout)
    mean the same."""
    options = ["--target", auth_server.target, "--token", TOKEN, "--timeout", "5", "--json"]
    argv = [*options, "stats"] if where == "before" else ["stats", *options]
    done = subprocess.run([sys.executable, "-m", "pagedserve.cli.pagedctl", *argv],
                          cwd=REPO_ROOT, env=hermetic_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout)["total"]["num_blocks"], int)


def test_an_option_after_the_command_wins_over_one_before() -> None:
    from pagedserve.cli.pagedctl import build_parser
    args = build_parser().parse_args(["--target", "a:1", "--json", "audit", "--target", "b:2"])
    assert (args.target, args.json, args.token, args.timeout) == ("b:2", True, "", 10.0)
    args = build_parser().parse_args(["audit", "--json"])
    assert (args.target, args.json) == ("127.0.0.1:50052", True)


def test_json_prints_integers_as_numbers(server: AllocatorProcess,
                                         stub: pb_grpc.AllocatorStub) -> None:
    """proto3 JSON writes 64-bit integers as strings; pagedctl's JSON is for scripts."""
    register(stub, "json-numbers", num_blocks=2, block_size=4)
    (pool,) = json.loads(pagedctl(server.target, "stats", "--executor", "json-numbers",
                                  "--json").stdout)["pools"]
    assert {key: pool[key] for key in ("num_blocks", "num_used_blocks", "tokens_stored",
                                       "slots_allocated", "block_size")} == {
        "num_blocks": 2, "num_used_blocks": 0, "tokens_stored": 0, "slots_allocated": 0,
        "block_size": 4}
    dumped = json.loads(pagedctl(server.target, "blocks", "json-numbers", "--json").stdout)
    assert [(b["block_id"], b["ref_count"]) for b in dumped["blocks"]] == [(0, 0), (1, 0)]


def test_events_into_a_closed_pipe_end_quietly(allocator: AllocatorProcess) -> None:
    """`pagedctl --json events --follow | head -1`: no BrokenPipeError traceback."""
    stub = pb_grpc.AllocatorStub(allocator.channel())
    register(stub, "pipe-a", num_blocks=2, block_size=4)
    follower = subprocess.Popen(
        [sys.executable, "-m", "pagedserve.cli.pagedctl", "--target", allocator.target,
         "--json", "events", "--follow"], cwd=REPO_ROOT, env=hermetic_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        assert json.loads(follower.stdout.readline())["executor_id"] == "pipe-a"
        follower.stdout.close()   # the reader goes away, as `head -1` does
        for index in range(20):   # the next event the follower prints finds the pipe closed
            register(stub, f"pipe-{index}", num_blocks=2, block_size=4)
            if follower.poll() is not None:
                break
            time.sleep(0.1)
        assert follower.wait(timeout=10) == 141
        assert follower.stderr is not None and follower.stderr.read() == ""
    finally:
        follower.kill()
        follower.wait()
