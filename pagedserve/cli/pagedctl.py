"""pagedctl: inspect and administer a running allocator.

    pagedctl [--target HOST:PORT] [--token T] [--json] stats | executors | sequences |
             table SEQ | blocks EXECUTOR [--png FILE] | audit | reset-prefix-cache |
             events [--from SEQ] [--follow]

Human-readable tables by default, `--json` for machines (one JSON object per line for
events). `audit` exits 1 when it finds a violation; any RPC error exits 2 with its status code
and message.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.cli.tables import format_table
from pagedserve.common.client import open_channel
from pagedserve.common.config import env_or

STATE_NAMES = {pb.BLOCK_STATE_FREE: "free", pb.BLOCK_STATE_CACHED_FREE: "cached-free",
               pb.BLOCK_STATE_USED: "used"}
EVENT_NAMES = {pb.KV_EVENT_TYPE_BLOCK_STORED: "BlockStored",
               pb.KV_EVENT_TYPE_BLOCK_REMOVED: "BlockRemoved",
               pb.KV_EVENT_TYPE_POOL_RESET: "PoolReset"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedctl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=env_or("PAGEDSERVE_ALLOCATOR", "127.0.0.1:50052"),
                        help="allocator host:port (env PAGEDSERVE_ALLOCATOR)")
    parser.add_argument("--token", default=env_or("PAGEDSERVE_AUTH_TOKEN", ""),
                        help="bearer token (env PAGEDSERVE_AUTH_TOKEN)")
    parser.add_argument("--tls-ca", default="", help="CA certificate to reach a TLS allocator")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per RPC")
    parser.add_argument("--json", action="store_true", help="print the raw response as JSON")
    commands = parser.add_subparsers(dest="command", required=True)
    stats = commands.add_parser("stats", help="block usage and prefix-cache counters")
    stats.add_argument("--executor", default="", help="only this executor's pool")
    commands.add_parser("executors", help="registered executors and their leases")
    sequences = commands.add_parser("sequences", help="live sequences")
    sequences.add_argument("--executor", default="", help="only this executor's sequences")
    table = commands.add_parser("table", help="the block table of one sequence")
    table.add_argument("seq_id")
    table.add_argument("--executor", default="", help="executor holding the sequence")
    blocks = commands.add_parser("blocks", help="every block of one pool")
    blocks.add_argument("executor_id")
    blocks.add_argument("--png", default="", help="also draw the pool into this PNG file")
    commands.add_parser("audit", help="check every invariant; exit 1 on a violation")
    reset = commands.add_parser("reset-prefix-cache", help="forget every cached prefix")
    reset.add_argument("--executor", default="", help="only this executor's pool")
    events = commands.add_parser("events", help="KV events: what entered and left the caches")
    events.add_argument("--from", dest="from_seq", type=int, default=0,
                        help="first sequence number to print (default: the oldest kept)")
    events.add_argument("--follow", action="store_true",
                        help="keep printing new events until Ctrl-C")
    return parser


def show_stats(response: pb.GetStatsResponse) -> str:
    durability = (f"state in {response.state_store}, journal at {response.applied_seq}"
                  if response.state_store != "memory" else "state in memory (not durable)")
    if not response.pools:
        return f"no executor has registered a pool yet\n{durability}"
    rows = [[p.executor_id, p.num_blocks, p.num_used_blocks, p.num_cached_free_blocks,
             p.num_free_blocks, p.usage_percent, p.prefix_hit_rate * 100, p.tokens_stored,
             p.slots_allocated, p.num_sequences]
            for p in [*response.pools, response.total]]
    text = format_table(["pool", "blocks", "used", "cached-free", "free", "usage %", "hit %",
                         "tokens", "slots", "seqs"], rows)
    histogram = ", ".join(f"{b.ref_count}: {b.num_blocks}"
                          for b in response.total.refcount_histogram)
    return (f"{text}\nrefcount histogram (refcount: blocks): {histogram or 'no used blocks'}"
            f"\n{durability}")


def show_executors(response: pb.ListExecutorsResponse) -> str:
    return format_table(
        ["executor", "address", "epoch", "blocks", "block size", "lease s", "waiting", "running",
         "last step", "model"],
        [[e.executor_id, e.address, e.epoch, e.num_blocks, e.block_size, e.lease_remaining_s,
          e.num_waiting, e.num_running, e.last_step_id, e.model_fingerprint]
         for e in response.executors])


def show_sequences(response: pb.ListSequencesResponse) -> str:
    return format_table(
        ["executor", "sequence", "tokens", "blocks", "cached", "computed"],
        [[s.executor_id, s.seq_id, s.num_tokens, s.num_blocks, s.num_cached_tokens,
          s.num_computed_tokens] for s in response.sequences])


def show_table(response: pb.GetBlockTableResponse) -> str:
    return (f"sequence {response.seq_id} on {response.executor_id}: {response.num_tokens} tokens "
            f"in {len(response.block_ids)} blocks of {response.block_size}\n"
            + " ".join(str(block) for block in response.block_ids))


def show_blocks(response: pb.DumpBlocksResponse) -> str:
    table = format_table(
        ["block", "state", "refs", "tokens", "hash"],
        [[b.block_id, STATE_NAMES.get(b.state, "?"), b.ref_count, b.num_tokens,
          b.block_hash.hex()[:16]] for b in response.blocks])
    return f"{table}\nfree list (taken first → last): {' '.join(map(str, response.free_list))}"


def show_audit(response: pb.AuditResponse) -> str:
    if not response.violations:
        return f"ok: {response.num_pools} pools, {response.num_blocks} blocks, no violations"
    return "\n".join([f"{len(response.violations)} violations:",
                      *[f"  {v}" for v in response.violations]])


def show_event(event: pb.KvEvent) -> str:
    head = f"#{event.seq} {EVENT_NAMES.get(event.type, '?'):<12} {event.executor_id}"
    if event.type == pb.KV_EVENT_TYPE_POOL_RESET:
        size = (f"{event.num_blocks} blocks of {event.block_size}" if event.num_blocks
                else "pool gone")
        return f"{head} {event.reason} ({size})"
    text = f"{head} block {event.block_id} hash {event.block_hash.hex()[:16]}"
    if event.type == pb.KV_EVENT_TYPE_BLOCK_STORED:
        text += (f" parent {event.parent_block_hash.hex()[:16]} "
                 f"tokens [{', '.join(map(str, event.token_ids))}]")
    return text


def print_events(args: argparse.Namespace) -> int:
    """Streams events to stdout as they arrive; Ctrl-C ends a --follow cleanly."""
    channel = open_channel(args.target, args.token, args.tls_ca)
    call = pb_grpc.AllocatorAdminStub(channel).StreamEvents(
        pb.StreamEventsRequest(from_seq=args.from_seq, follow=args.follow),
        timeout=None if args.follow else args.timeout)
    try:
        for event in call:
            print(json.dumps(message_to_dict(event)) if args.json else show_event(event),
                  flush=True)
    except KeyboardInterrupt:
        call.cancel()
    return 0


def run(args: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    """Calls the RPC for the command; returns its response and how to print it."""
    channel = open_channel(args.target, args.token, args.tls_ca)
    admin = pb_grpc.AllocatorAdminStub(channel)
    timeout = args.timeout
    if args.command == "stats":
        return admin.GetStats(pb.GetStatsRequest(executor_id=args.executor),
                              timeout=timeout), show_stats
    if args.command == "executors":
        return admin.ListExecutors(pb.ListExecutorsRequest(), timeout=timeout), show_executors
    if args.command == "sequences":
        return admin.ListSequences(pb.ListSequencesRequest(executor_id=args.executor),
                                   timeout=timeout), show_sequences
    if args.command == "table":
        return admin.GetBlockTable(pb.GetBlockTableRequest(
            executor_id=args.executor, seq_id=args.seq_id), timeout=timeout), show_table
    if args.command == "blocks":
        dump = admin.DumpBlocks(pb.DumpBlocksRequest(executor_id=args.executor_id),
                                timeout=timeout)
        if args.png:
            from pagedserve.cli.pool_picture import draw_pool  # matplotlib only when asked
            draw_pool(dump, args.png)
            print(f"wrote {args.png}", file=sys.stderr)
        return dump, show_blocks
    if args.command == "audit":
        return admin.Audit(pb.AuditRequest(), timeout=timeout), show_audit
    response = admin.ResetPrefixCache(pb.ResetPrefixCacheRequest(executor_id=args.executor),
                                      timeout=timeout)
    return response, lambda r: f"dropped {r.num_entries_dropped} prefix-cache entries"


def message_to_dict(message: Any) -> dict[str, Any]:
    """JSON-ready dict that keeps zero-valued fields (a free block has ref_count 0)."""
    try:
        return MessageToDict(message, preserving_proto_field_name=True,
                             always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf < 5.26 names the option differently
        return MessageToDict(message, preserving_proto_field_name=True,
                             including_default_value_fields=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "events":
            return print_events(args)
        response, show = run(args)
    except grpc.RpcError as error:
        print(f"pagedctl: {error.code().name}: {error.details()}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(message_to_dict(response), indent=2))
    else:
        print(show(response))
    if args.command == "audit" and response.violations:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
