"""The allocator's whole state as plain JSON-able data, and back, exactly.

A snapshot holds everything replay would otherwise have to rebuild: every pool's blocks
(reference counts and prefix-cache entries), the free list in its LRU order, the sequences with
their block tables and hashing progress, epochs, node-id and event counters, and the recorded
results of recent steps. Leases and load figures are not kept: a restored executor gets a fresh
lease (the allocator's downtime is not its fault) and reports its load with its next heartbeat.

Only blocks that differ from a fresh one are written, and the free list as runs of consecutive
ids, so an idle pool of a million blocks takes a few bytes. Token ids, most of a busy fleet's
snapshot, are written in their packed form (4 bytes each, little-endian, block_hash.py) as hex:
one C call per block or sequence where a JSON list costs an int object and its text per token.
Format 1 wrote them as lists; it still restores.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from librt.vecs import vec
from mypy_extensions import i32

from allocator_service.core.allocator import Allocator, RecordedStep, RegisteredExecutor
from allocator_service.core.block import PrefixKey, split_prefix_key
from allocator_service.core.block_hash import BlockHash, PackedTokens, pack_tokens
from allocator_service.core.executor_pool import ExecutorPool
from allocator_service.core.sequence import Sequence
from pagedserve.protocol.block_ops import OpResult, OpStatus, SeqId, StepResult
from pagedserve.protocol.token_bytes import array_to_bytes, bytes_to_array

FORMAT_VERSION = 3
# Format 2 is format 3 with every token of a sequence (format 3 keeps those after its hashed
# blocks, as the core does); format 1 is format 2 with token ids as JSON lists of ints.
RESTORABLE_VERSIONS = (1, 2, FORMAT_VERSION)

Json = dict[str, Any]


def capture(core: Allocator) -> Json:
    """A deep copy of the core's state: later changes to the core do not reach it."""
    return {
        "version": FORMAT_VERSION,
        "last_epoch": core.last_epoch,
        "last_event_seq": core.events.last_seq,
        # In the core's own order (registration), so a restored core iterates alike.
        "executors": [_capture_executor(ex) for ex in core.executors.values()],
    }


def restore(core: Allocator, data: Json) -> None:
    """Loads a snapshot into a core that has no executors yet."""
    if data.get("version") not in RESTORABLE_VERSIONS:
        raise ValueError(f"snapshot format {data.get('version')!r} is not one of "
                         f"{', '.join(map(str, RESTORABLE_VERSIONS))}; it was written by another "
                         "pagedserve version")
    tokens_of = _TOKEN_READERS[data["version"]]
    assert not core.executors, "restore() into a core that already holds executors"
    core.last_epoch = data["last_epoch"]
    core.events.last_seq = data["last_event_seq"]
    lease_expires_at = core.clock() + core.lease_ttl_s
    for item in data["executors"]:
        pool = _restore_pool(item["pool"], core, tokens_of)
        step_log = OrderedDict(
            (step_id, RecordedStep(bytes.fromhex(identity), _restore_result(result)))
            for step_id, identity, result in item["step_log"])
        core.add_executor(RegisteredExecutor(
            executor_id=item["executor_id"], address=item["address"], epoch=item["epoch"],
            model_fingerprint=item["model_fingerprint"], pool=pool,
            lease_expires_at=lease_expires_at, last_step_id=item["last_step_id"],
            # Absent from snapshots written before executors registered a number.
            executor_index=item.get("executor_index"), step_log=step_log))


# -- executors and their step records ---------------------------------------------------------

def _capture_executor(ex: RegisteredExecutor) -> Json:
    return {
        "executor_id": ex.executor_id, "address": ex.address, "epoch": ex.epoch,
        "model_fingerprint": ex.model_fingerprint, "last_step_id": ex.last_step_id,
        "executor_index": ex.executor_index,
        "step_log": [[step_id, _identity_hex(recorded), _capture_result(recorded)]
                     for step_id, recorded in ex.step_log.items()],
        "pool": _capture_pool(ex.pool),
    }


def _identity_hex(recorded: RecordedStep) -> str:
    if not isinstance(recorded.identity, bytes):
        raise TypeError("only steps identified by a digest can be snapshotted; the server "
                        "always passes one")
    return recorded.identity.hex()


def _capture_result(recorded: RecordedStep) -> Json:
    # From the packed form the step log keeps: rebuilding every result's objects just to read
    # them would cost a snapshot (taken under the state lock) tens of milliseconds in a fleet.
    num_free_blocks, results = recorded.packed_result
    return {"num_free_blocks": num_free_blocks,
            "results": [[status, message, list(table), cached, list(new),
                         [list(copy) for copy in copies]]
                        for status, message, table, cached, new, copies in results]}


def _restore_result(data: Json) -> StepResult:
    return StepResult(
        [OpResult(OpStatus(status), message, list(table), cached, list(new),
                  [(src, dst) for src, dst in copies])
         for status, message, table, cached, new, copies in data["results"]],
        data["num_free_blocks"])


# -- pools -------------------------------------------------------------------------------------

def _capture_pool(pool: ExecutorPool) -> Json:
    blocks = pool.blocks
    return {
        "num_blocks": pool.num_blocks, "block_size": pool.block_size,
        "model_fingerprint": pool.model_fingerprint,
        "last_node_id": blocks.last_node_id,
        "prefix_query_tokens": pool.prefix_query_tokens,
        "prefix_hit_tokens": pool.prefix_hit_tokens,
        "blocks": [_capture_block(*saved) for saved in blocks.saved_blocks()],
        "free_list": _runs(blocks.free_block_ids()),
        "sequences": [_capture_sequence(seq) for seq in pool.sequences.values()],
    }


def _capture_block(block_id: int, ref_count: int, block_hash: bytes, parent_hash: bytes,
                   tokens: bytes, node_id: int, parent_key: PrefixKey) -> list[Any]:
    if not node_id:
        return [block_id, ref_count]
    return [block_id, ref_count, block_hash.hex(), parent_hash.hex(), tokens.hex(), node_id,
            parent_key]


def _capture_sequence(seq: Sequence) -> Json:
    return {"seq_id": seq.seq_id, "cache_salt": seq.cache_salt,
            "block_table": seq.block_ids(), "num_tokens": seq.num_tokens,
            "unhashed_token_ids": array_to_bytes(seq.unhashed_token_ids).hex(),
            "num_cached_tokens": seq.num_cached_tokens,
            "num_computed_tokens": seq.num_computed_tokens,
            "num_hashed_blocks": seq.num_hashed_blocks,
            "chain_hash": seq.chain_hash.hex(), "chain_key": seq.chain_key}


# Token ids as each format writes them -> their packed form (PackedTokens).
TokenReader = Callable[[Any], bytes]
_TOKEN_READERS: dict[int, TokenReader] = {1: pack_tokens, 2: bytes.fromhex,
                                           FORMAT_VERSION: bytes.fromhex}


def _restore_pool(data: Json, core: Allocator, tokens_of: TokenReader) -> ExecutorPool:
    pool = ExecutorPool(data["num_blocks"], data["block_size"], data["model_fingerprint"],
                        core.hash_fn)
    blocks = pool.blocks
    blocks.last_node_id = data["last_node_id"]
    pool.prefix_query_tokens = data["prefix_query_tokens"]
    pool.prefix_hit_tokens = data["prefix_hit_tokens"]
    for item in data["blocks"]:
        blocks.set_ref_count(item[0], item[1])
        if len(item) > 2:
            blocks.restore_entry(item[0], BlockHash(bytes.fromhex(item[2])),
                                 BlockHash(bytes.fromhex(item[3])), PackedTokens(tokens_of(item[4])),
                                 item[5], item[6])
    # The constructor linked every block; relink only the free ones, in their saved order.
    blocks.restore_free_list(_expand(data["free_list"]))
    for item in data["sequences"]:
        pool.sequences[SeqId(item["seq_id"])] = Sequence(
            seq_id=SeqId(item["seq_id"]), cache_salt=item["cache_salt"],
            block_table=vec[i32](item["block_table"]),
            **_sequence_tokens(item, pool.block_size, tokens_of),
            num_cached_tokens=item["num_cached_tokens"],
            num_computed_tokens=item["num_computed_tokens"],
            num_hashed_blocks=item["num_hashed_blocks"],
            chain_hash=bytes.fromhex(item["chain_hash"]),
            chain_node=split_prefix_key(item["chain_key"]))
    return pool


def _sequence_tokens(item: Json, block_size: int, tokens_of: TokenReader) -> Json:
    """A saved sequence's num_tokens and unhashed_token_ids; formats 1 and 2 saved every
    token, and the core now keeps those after the hashed blocks only."""
    if "unhashed_token_ids" in item:
        return {"num_tokens": item["num_tokens"],
                "unhashed_token_ids": bytes_to_array(tokens_of(item["unhashed_token_ids"]))}
    tokens = bytes_to_array(tokens_of(item["token_ids"]))
    return {"num_tokens": len(tokens),
            "unhashed_token_ids": tokens[item["num_hashed_blocks"] * block_size:]}


def _runs(ids: Any) -> list[list[int]]:
    """[[first, count], ...] for runs of consecutive ascending ids, in order."""
    runs: list[list[int]] = []
    for block_id in ids:
        if runs and runs[-1][0] + runs[-1][1] == block_id:
            runs[-1][1] += 1
        else:
            runs.append([block_id, 1])
    return runs


def _expand(runs: list[list[int]]) -> Any:
    for first, count in runs:
        yield from range(first, first + count)
