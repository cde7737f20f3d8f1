"""pagedctl: inspect and administer a running allocator, or an allocator group.

    pagedctl [--target HOST:PORT[,HOST:PORT...]] [--token T] [--json] stats | executors |
             sequences | table SEQ | blocks EXECUTOR [--png FILE] | audit |
             reset-prefix-cache | events [--from SEQ] [--follow]

The global options (--target, --token, --tls-ca, --timeout, --json) go before or after the
command: `pagedctl --json stats` and `pagedctl stats --json` are the same.

A --target that lists every shard of an allocator group shows the group as one allocator:
stats, executors, sequences and audit ask every shard and merge their answers (`--per-shard`
shows each shard's own stats or audit instead), and a command about one executor or sequence
finds the shard that holds it. A shard that does not answer fails the command, naming it.
`events` reads one allocator: each shard numbers its own events.

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
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor

from pagedserve.allocator.v1 import allocator_pb2 as pb
from pagedserve.allocator.v1 import allocator_pb2_grpc as pb_grpc
from pagedserve.cli.tables import format_table
from pagedserve.common.allocator_group import AllocatorGroup, merge_audits, merge_stats
from pagedserve.common.allocator_shards import parse_allocator_group
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
                        help="allocator host:port, or host:port,host:port,... for every shard "
                             "of an allocator group (env PAGEDSERVE_ALLOCATOR)")
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
    stats.add_argument("--per-shard", action="store_true",
                       help="each shard's own stats, one after the other")
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
    audit = command("audit", "check every invariant; exit 1 on a violation")
    audit.add_argument("--per-shard", action="store_true",
                       help="each shard's own audit, one after the other")
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


def show_executors(response: pb.ListExecutorsResponse, shards: dict[str, str] | None = None
                   ) -> str:
    """The executors; `shards` (executor id -> its allocator) adds a column for a group."""
    shard_column = ["allocator"] if shards else []
    return format_table(
        ["executor", "index", "address", "epoch", "blocks", "block size", "lease s", "waiting",
         "running", "last step", "model", *shard_column],
        [[e.executor_id, e.executor_index if e.HasField("executor_index") else "-", e.address,
          e.epoch, e.num_blocks, e.block_size, e.lease_remaining_s,
          e.num_waiting, e.num_running, e.last_step_id, e.model_fingerprint,
          *([shards[e.executor_id]] if shards else [])]
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
    shards = parse_allocator_group(args.target)
    if len(shards) > 1:
        raise ValueError(f"events reads one allocator, and --target lists {len(shards)}: each "
                         f"shard numbers its own events, so give one of {', '.join(shards)}")
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
    """Calls the RPC for the command (on every shard of a group); returns the response and how
    to print it."""
    group = AllocatorGroup.from_text(args.target, args.token, args.tls_ca)
    try:
        return run_on(group, args)
    finally:
        group.close()


def run_on(group: AllocatorGroup, args: argparse.Namespace
           ) -> tuple[Any, Callable[[Any], str]]:
    timeout = args.timeout

    def everywhere(method: str, request: Any) -> dict[str, Any]:
        answers = group.ask(method, request, timeout)
        group.raise_failure(answers.failures)
        return answers.replies

    def where_found(method: str, request: Any, what: str) -> Any:
        """The answer of the one shard that knows `what` (the others say NOT_FOUND)."""
        answers = group.ask(method, request, timeout)
        if len(answers.replies) > 1:
            raise ValueError(f"{what} is known to {len(answers.replies)} allocators "
                             f"({', '.join(answers.replies)}); name its executor with --executor")
        if answers.replies:
            return next(iter(answers.replies.values()))
        # Not found anywhere, unless a shard that could hold it did not answer.
        lost = {shard: error for shard, error in answers.failures.items()
                if error.code() != grpc.StatusCode.NOT_FOUND}
        group.raise_failure(lost or answers.failures)
        raise AssertionError("unreachable: no shard answered and none failed")

    command = args.command
    if command == "stats" and args.executor:
        return where_found("GetStats", pb.GetStatsRequest(executor_id=args.executor),
                           f"executor {args.executor}"), show_stats
    if command == "stats":
        replies = everywhere("GetStats", pb.GetStatsRequest())
        if args.per_shard:
            return PerShard(replies), lambda r: r.show(show_stats)
        return merge_stats(list(replies.values())), show_stats
    if command == "executors":
        listed, failed = group.list_executors(timeout)
        group.raise_failure(failed)
        response = pb.ListExecutorsResponse(executors=[e.info for e in listed.values()])
        shards = {executor_id: e.shard for executor_id, e in listed.items()}
        return response, (lambda r: show_executors(r, shards if len(group.shards) > 1 else None))
    if command == "sequences" and args.executor:
        return where_found("ListSequences", pb.ListSequencesRequest(executor_id=args.executor),
                           f"executor {args.executor}"), show_sequences
    if command == "sequences":
        replies = everywhere("ListSequences", pb.ListSequencesRequest())
        return pb.ListSequencesResponse(sequences=sorted(
            (seq for reply in replies.values() for seq in reply.sequences),
            key=lambda seq: (seq.executor_id, seq.seq_id))), show_sequences
    if command == "table":
        return where_found("GetBlockTable", pb.GetBlockTableRequest(
            executor_id=args.executor, seq_id=args.seq_id),
            f"sequence {args.seq_id!r}"), show_table
    if command == "blocks":
        return where_found("DumpBlocks", pb.DumpBlocksRequest(executor_id=args.executor_id),
                           f"executor {args.executor_id}"), show_blocks
    if command == "audit":
        replies = everywhere("Audit", pb.AuditRequest())
        if args.per_shard:
            return PerShard(replies), lambda r: r.show(show_audit)
        return merge_audits(replies), show_audit
    reset = pb.ResetPrefixCacheRequest(executor_id=args.executor)
    if args.executor:
        response = where_found("ResetPrefixCache", reset, f"executor {args.executor}")
    else:
        response = pb.ResetPrefixCacheResponse(num_entries_dropped=sum(
            reply.num_entries_dropped
            for reply in everywhere("ResetPrefixCache", reset).values()))
    return response, lambda r: f"dropped {r.num_entries_dropped} prefix-cache entries"


@dataclass(frozen=True, slots=True)
class PerShard:
    """Each shard's own answer, for --per-shard."""
    replies: dict[str, Any]

    def show(self, show_one: Callable[[Any], str]) -> str:
        return "\n\n".join(f"allocator {shard}:\n{show_one(reply)}"
                            for shard, reply in self.replies.items())

    @property
    def violations(self) -> list[str]:
        return [violation for reply in self.replies.values()
                for violation in getattr(reply, "violations", ())]

    def as_dict(self) -> dict[str, Any]:
        return {"shards": {shard: message_to_dict(reply)
                           for shard, reply in self.replies.items()}}


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
    except ValueError as error:    # a --target that is no address list, an ambiguous name
        print(f"pagedctl: {error}", file=sys.stderr)
        return 2
    if args.command == "blocks" and args.png:
        from pagedserve.cli.pool_picture import draw_pool  # matplotlib only when asked
        draw_pool(response, args.png)
        summary = blocks_summary(response, args.png)
        print(json.dumps(summary) if args.json else show_blocks_summary(summary))
    elif args.json:
        print(json.dumps(response.as_dict() if isinstance(response, PerShard)
                         else message_to_dict(response), indent=2))
    else:
        print(show(response))
    sys.stdout.flush()
    if args.command == "audit" and response.violations:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
