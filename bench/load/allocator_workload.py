"""Block-op streams for the allocator benchmark, shaped like a continuous-batching scheduler's.

`ServingMix` is the realistic mix: prompts admitted (half of them behind one of a few shared
system prompts), every running sequence decoding one token per step with its computed mark
advancing and a few slots reserved ahead, an occasional fork (parallel sampling) whose first
write copies the shared tail block, and a Free when a sequence reaches its output length.

`DecodeBatch` is the steady decode step alone: N sequences, each appending one token per step.

Both are generated from a seed, independently of the allocator's answers; the benchmark counts
any op that did not come back OK, and the sizes are chosen so that none should.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from pagedserve.protocol.block_ops import AllocateOp, AppendOp, BlockOp, ForkOp, FreeOp, SeqId

VOCAB_SIZE = 32_000


@dataclass(slots=True)
class LiveSeq:
    seq_id: SeqId
    num_tokens: int
    # Tokens it still generates before it finishes and is freed.
    remaining: int


class ServingMix:
    def __init__(self, seed: int = 0, max_running: int = 256, lookahead_slots: int = 4,
                 admit_per_step: int = 16, fork_probability: float = 0.2,
                 num_shared_prefixes: int = 4, shared_prefix_len: int = 256) -> None:
        self.rng = random.Random(seed)
        self.max_running = max_running
        self.lookahead_slots = lookahead_slots
        self.admit_per_step = admit_per_step
        # Chance per step that one running sequence forks.
        self.fork_probability = fork_probability
        self.shared_prefixes = [self._tokens(shared_prefix_len)
                                for _ in range(num_shared_prefixes)]
        self.running: list[LiveSeq] = []
        self.op_counts: Counter[str] = Counter()
        self._next_id = 0

    def next_step(self) -> list[BlockOp]:
        """The ops of one scheduler iteration: finish, decode, fork, admit (in that order)."""
        ops: list[BlockOp] = []
        still_running = []
        for seq in self.running:
            if seq.remaining == 0:
                ops.append(FreeOp(seq.seq_id))
            else:
                still_running.append(seq)
        self.running = still_running
        rng, lookahead = self.rng, self.lookahead_slots
        for seq in self.running:
            # Every token before the new one has its K/V written by the previous forward pass.
            ops.append(AppendOp(seq.seq_id, (rng.randrange(VOCAB_SIZE),), lookahead,
                                seq.num_tokens))
            seq.num_tokens += 1
            seq.remaining -= 1
        if self.running and len(self.running) < self.max_running and (
                rng.random() < self.fork_probability):
            parent = rng.choice(self.running)
            child = LiveSeq(self._new_id(), parent.num_tokens, rng.randint(16, 128))
            ops.append(ForkOp(parent.seq_id, child.seq_id))
            self.running.append(child)
        for _ in range(min(self.admit_per_step, self.max_running - len(self.running))):
            ops.append(self._admit())
        self.op_counts.update(type(op).__name__ for op in ops)
        return ops

    def _admit(self) -> AllocateOp:
        rng = self.rng
        if rng.random() < 0.5:
            prompt = rng.choice(self.shared_prefixes) + self._tokens(rng.randint(16, 256))
        else:
            prompt = self._tokens(rng.randint(64, 512))
        seq = LiveSeq(self._new_id(), len(prompt), rng.randint(32, 512))
        self.running.append(seq)
        return AllocateOp(seq.seq_id, prompt, "", self.lookahead_slots)

    def _tokens(self, count: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(VOCAB_SIZE) for _ in range(count))

    def _new_id(self) -> SeqId:
        self._next_id += 1
        return SeqId(f"seq-{self._next_id}")


class DecodeBatch:
    """`num_seqs` sequences of `prompt_len` tokens, then one token each per `next_appends()`."""

    def __init__(self, num_seqs: int = 256, prompt_len: int = 128, lookahead_slots: int = 4,
                 seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.seq_ids = [SeqId(f"seq-{i}") for i in range(num_seqs)]
        self.prompt_len = prompt_len
        self.lookahead_slots = lookahead_slots
        self.num_tokens = [prompt_len] * num_seqs

    def allocations(self) -> list[AllocateOp]:
        rng = self.rng
        return [AllocateOp(seq_id, tuple(rng.randrange(VOCAB_SIZE) for _ in range(self.prompt_len)),
                           "", self.lookahead_slots) for seq_id in self.seq_ids]

    def next_appends(self) -> list[AppendOp]:
        rng, lookahead, num_tokens = self.rng, self.lookahead_slots, self.num_tokens
        ops = []
        for index, seq_id in enumerate(self.seq_ids):
            ops.append(AppendOp(seq_id, (rng.randrange(VOCAB_SIZE),), lookahead,
                                num_tokens[index]))
            num_tokens[index] += 1
        return ops
