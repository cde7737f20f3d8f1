"""`python -m tests.support.core_trace SEED`: drives an allocator core through a seeded random
workload and prints everything it answered, its KV events, its final snapshot and its audit, one
JSON document. Run once per core build (PAGEDSERVE_ALLOCATOR_CORE=python / compiled), the two
documents must be equal (tests/allocator/test_compiled_core.py)."""
from __future__ import annotations

import json
import random
import sys
from hashlib import sha256

from allocator_service.core.allocator import Allocator
from allocator_service.core.audit import audit_pool
from allocator_service.core.kv_events import records
from allocator_service.durability import snapshot
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, ForkOp, FreeOp

SYSTEM_PROMPTS = ([7] * 9, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5])


def trace(seed: int, num_steps: int = 400) -> dict[str, object]:
    rng = random.Random(seed)
    core = Allocator(step_log_size=8, clock=lambda: 0.0)
    executors = {"a": core.register_executor("a", "a:1", 48, 4, "m").epoch,
                 "b": core.register_executor("b", "b:1", 64, 2, "m").epoch}
    live: dict[str, list[str]] = {eid: [] for eid in executors}
    answers, next_id = [], 0
    for step_id in range(1, num_steps + 1):
        eid = rng.choice(sorted(executors))
        ops: list = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            seqs = live[eid]
            if kind < 0.25 or not seqs:
                next_id += 1
                prompt = rng.choice(SYSTEM_PROMPTS) + [rng.randrange(50)
                                                       for _ in range(rng.randint(1, 12))]
                ops.append(AllocateOp(f"s{next_id}", tuple(prompt), rng.choice(["", "t"]),
                                      rng.randint(0, 3)))
                seqs.append(f"s{next_id}")
            elif kind < 0.75:
                tokens = tuple(rng.randrange(50) for _ in range(rng.randint(0, 5)))
                ops.append(AppendOp(rng.choice(seqs), tokens, rng.randint(0, 4),
                                    rng.randint(0, 40)))
            elif kind < 0.8:
                next_id += 1
                ops.append(ForkOp(rng.choice(seqs), f"s{next_id}"))
                seqs.append(f"s{next_id}")
            else:
                ops.append(FreeOp(seqs.pop(rng.randrange(len(seqs)))))
        # The server identifies a step by a digest of its bytes; snapshots need one.
        digest = sha256(repr((eid, step_id, ops)).encode()).digest()
        result = core.step(eid, executors[eid], step_id, ops, digest)
        for op, op_result in zip(ops, result.results):  # ids that were never created
            new_id = getattr(op, "child_seq_id", None) or (
                op.seq_id if isinstance(op, AllocateOp) else None)
            if op_result.status and new_id in live[eid]:
                live[eid].remove(new_id)
        answers.append([result.num_free_blocks, [
            [int(r.status), r.message, r.block_table, r.num_cached_tokens, r.new_blocks,
             [list(copy) for copy in r.copies]] for r in result.results]])
        if rng.random() < 0.05:  # a retry answers what the step answered
            again = core.step(eid, executors[eid], step_id, ops, digest)
            answers.append([again.replayed, again.num_free_blocks])
    return {"answers": answers,
            "events": [list(event) for event in records(core.events.take())],
            "snapshot": snapshot.capture(core),
            "audit": {eid: audit_pool(eid, core.executors[eid].pool) for eid in executors}}


if __name__ == "__main__":
    json.dump(trace(int(sys.argv[1])), sys.stdout, sort_keys=True, default=str)
