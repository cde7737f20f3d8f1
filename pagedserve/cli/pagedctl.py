"""pagedctl: inspect and administer a running allocator.

    pagedctl [--target HOST:PORT] [--token T] [--json] stats | executors | sequences |
             table SEQ | blocks EXECUTOR [--png FILE] | audit | reset-prefix-cache |
             events [--from SEQ] [--follow]

The global options (--target, --token, --tls-ca, --timeout, --json) go before or after the
command: `pagedctl --json stats` and `pagedctl stats --json` are the same.

Human-readable tables by default, `--json` for machines (one JSON object per line for
events): integers are JSON numbers and block hashes hex, as the tables show them. `audit`
exits 1 when it finds a violation; any RPC error exits 2 with its status code and message.
Output into a closed pipe (`pagedctl events | head`) ends quietly with status 141, as a
Unix tool killed by SIGPIPE does.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor

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


def add_global_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The options every command shares. The main parser holds their defaults; each command's
    parser accepts them too (after the command) without defaults, so a value given before the
    command is not overwritten by a default after it."""
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument("--target",
                        default=default(env_or("PAGEDSERVE_ALLOCATOR", "127.0.0.1:50052")),
                        help="allocator host:port (env PAGEDSERVE_ALLOCATOR)")
    parser.add_argument("--token", default=default(env_or("PAGEDSERVE_AUTH_TOKEN", "")),
                        help="bearer token (env PAGEDSERVE_AUTH_TOKEN)")
    parser.add_argument("--tls-ca", default=default(""),
                        help="CA certificate to reach a TLS allocator")
    parser.add_argument("--timeout", type=float, default=default(10.0), help="seconds per RPC")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print the response as JSON (one object per line for events)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedctl", description=" ".join(
                                         __doc__.split("\n\n")[i] for i in (0, 2)),
                                     epilog="Global options go before or after the command.")
    add_global_options(parser, defaults=True)
    shared = argparse.ArgumentParser(add_help=False)
    add_global_options(shared, defaults=False)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, parents=[shared])

    stats = command("stats", "block usage and prefix-cache counters")
    stats.add_argument("--executor", default="", help="only this executor's pool")
    command("executors", "registered executors and their leases")
    sequences = command("sequences", "live sequences")
    sequences.add_argument("--executor", default="", help="only this executor's sequences")
    table = command("table", "the block table of one sequence")
    table.add_argument("seq_id")
    table.add_argument("--executor", default="", help="executor holding the sequence")
    blocks = command("blocks", "every block of one pool")
    blocks.add_argument("executor_id")
    blocks.add_argument("--png", default="",
                        help="draw the pool into this PNG file instead of listing every block "
                             "(prints a one-line summary)")
    command("audit", "check every invariant; exit 1 on a violation")
    reset = command("reset-prefix-cache", "forget every cached prefix")
    reset.add_argument("--executor", default="", help="only this executor's pool")
    events = command("events", "KV events: what entered and left the caches")
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


def blocks_summary(response: pb.DumpBlocksResponse, png: str) -> dict[str, Any]:
    """What `blocks --png` prints instead of every block: the file and the blocks per state."""
    counts = dict.fromkeys(STATE_NAMES.values(), 0)
    for block in response.blocks:
        state = STATE_NAMES.get(block.state, "?")
        counts[state] = counts.get(state, 0) + 1
    return {"png": png, "executor_id": response.executor_id,
            "num_blocks": len(response.blocks), "blocks_by_state": counts}


def show_blocks_summary(summary: dict[str, Any]) -> str:
    by_state = ", ".join(f"{count} {state}" for state, count in summary["blocks_by_state"].items())
    return (f"wrote {summary['png']}: {summary['executor_id']}, {summary['num_blocks']} blocks "
            f"({by_state})")


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
    except (KeyboardInterrupt, BrokenPipeError):
        call.cancel()
        raise
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
        return dump, show_blocks
    if args.command == "audit":
        return admin.Audit(pb.AuditRequest(), timeout=timeout), show_audit
    response = admin.ResetPrefixCache(pb.ResetPrefixCacheRequest(executor_id=args.executor),
                                      timeout=timeout)
    return response, lambda r: f"dropped {r.num_entries_dropped} prefix-cache entries"


def message_to_dict(message: Any) -> dict[str, Any]:
    """A JSON-ready dict of every field, zero values included (a free block has ref_count 0):
    integers as numbers (proto3 JSON would make 64-bit ones strings), bytes as hex (as the
    tables show hashes; proto3 JSON would make them base64), enums by name. A message or
    optional field that is not set is left out."""
    result: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_repeated(field):
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                result[field.name] = {str(k): _field_value(value_field, v)
                                      for k, v in value.items()}
            else:
                result[field.name] = [_field_value(field, item) for item in value]
        elif _has_presence(field) and not message.HasField(field.name):
            continue
        else:
            result[field.name] = _field_value(field, value)
    return result


def _is_repeated(field: FieldDescriptor) -> bool:
    is_repeated = getattr(field, "is_repeated", None)   # protobuf >= 6 deprecates .label
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == FieldDescriptor.LABEL_REPEATED


def _has_presence(field: FieldDescriptor) -> bool:
    has_presence = getattr(field, "has_presence", None)
    if has_presence is not None:
        return bool(has_presence)
    return field.message_type is not None or field.containing_oneof is not None


def _field_value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_to_dict(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value.hex()
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if field.type == FieldDescriptor.TYPE_FLOAT:
        return float(f"{value:.7g}")   # the float32 as written, not its double expansion
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_command(args)
    except BrokenPipeError:
        # The reader went away (`pagedctl events | head`): stop quietly, as a Unix tool killed
        # by SIGPIPE does, and keep Python from complaining when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        return 0 if args.command == "events" else 130


def run_command(args: argparse.Namespace) -> int:
    try:
        if args.command == "events":
            return print_events(args)
        response, show = run(args)
    except grpc.RpcError as error:
        print(f"pagedctl: {error.code().name}: {error.details()}", file=sys.stderr)
        return 2
    if args.command == "blocks" and args.png:
        from pagedserve.cli.pool_picture import draw_pool  # matplotlib only when asked
        draw_pool(response, args.png)
        summary = blocks_summary(response, args.png)
        print(json.dumps(summary) if args.json else show_blocks_summary(summary))
    elif args.json:
        print(json.dumps(message_to_dict(response), indent=2))
    else:
        print(show(response))
    sys.stdout.flush()
    if args.command == "audit" and response.violations:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
