"""What one engine iteration does: the block ops it sends in one Step, and the tokens it then
computes. Built by the scheduler, read by the model runner."""
from __future__ import annotations

from dataclasses import dataclass, field

from executor_service.engine.request import Sequence
from pagedserve.protocol.block_ops import AllocateOp, AppendOp, BlockOp, ForkOp, FreeOp


@dataclass(slots=True)
class PlannedOp:
    """A block op and the sequence whose mirror its result updates (None for a Free)."""
    op: BlockOp
    seq: Sequence | None
    # Number of tokens an Append or Allocate reports: the mirror's num_reported afterwards.
    reported: int = 0


@dataclass(slots=True)
class StepPlan:
    ops: list[PlannedOp] = field(default_factory=list)
    # Sequences computing tokens this iteration, with how many (1 for a decode).
    work: list[tuple[Sequence, int]] = field(default_factory=list)
    # The forward pass cannot start before the Step's answer: it grants tables (admission,
    # fork), a slot a sequence does not have yet, or a copy-on-write.
    needs_answer: bool = False
    # Of which: decoding sequences whose next slot lookahead did not cover (a stall).
    stalled: int = 0
    # The Step cannot be put off (coalesced) to a later iteration: a sequence's reserve would
    # run out first.
    urgent: bool = False
    # A beam search runs: its decision forks beams from the tokens the Step records and may be
    # undone by a preemption the answer makes, so the answer is mirrored before sampling.
    beams: bool = False
    # (src, dst) block copies to run before the forward pass, from the Step's answer.
    copies: list[tuple[int, int]] = field(default_factory=list)

    def block_ops(self) -> list[BlockOp]:
        return [planned.op for planned in self.ops]

    def free(self, seq_id: str) -> None:
        self.ops.append(PlannedOp(FreeOp(seq_id), None))

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.ops.append(PlannedOp(ForkOp(parent.seq_id, child.seq_id), child,
                                  reported=parent.num_reported))
        self.needs_answer = True

    def append(self, seq: Sequence, lookahead_slots: int) -> None:
        self.ops.append(PlannedOp(append_op(seq, lookahead_slots), seq,
                                  reported=len(seq.token_ids)))

    def allocate(self, seq: Sequence, lookahead_slots: int) -> None:
        self.ops.append(PlannedOp(
            AllocateOp(seq.seq_id, tuple(seq.token_ids), seq.request.cache_salt,
                       lookahead_slots), seq, reported=len(seq.token_ids)))
        self.needs_answer = True


def append_op(seq: Sequence, lookahead_slots: int) -> AppendOp:
    """The Append that reports a sequence's unreported tokens and its computed mark."""
    return AppendOp(seq.seq_id, tuple(seq.token_ids[seq.num_reported:]), lookahead_slots,
                    seq.num_computed)
