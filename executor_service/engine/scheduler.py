"""Continuous batching: which sequences run each iteration, and the block ops that get them
their slots.

Every iteration (`plan`):
1. frees what finished or was cancelled since the last one;
2. forks the children of an `n > 1` request whose prompt was just computed (they share its
   blocks; the first write into a shared block copies it);
3. runs every running sequence: a decode costs one token of the budget
   (`max_num_batched_tokens`), a prompt still being computed gets a chunk of what is left;
4. admits waiting requests, oldest first, while budget and `max_num_seqs` allow.

Steps are sparse: a decoding sequence sends an Append only when the allocator must act: when
its reserve of slots ahead falls below one whole block. That Append reports the tokens since
its last one (the block that just filled is hashed into the prefix cache) and reserves the next
block (`reserve_blocks` of them), so a steady decode costs one op per sequence per block (per
`reserve_blocks` blocks), not per token:

    block_size 16:   |.... block k ....|.... block k+1 ....|
                     ^ Append: publishes block k-1, reserves k+1 (16 slots of slack)
                                       ^ the next Append, 16 tokens later

Steps can also be coalesced (`step_interval` K > 1): while nothing needs the allocator's
answer before the forward pass (no admission, fork or copy-on-write, no sequence out of slots
or about to be), an iteration's ops wait, up to K - 1 iterations, and go out together with the
next Step. Waiting requests are admitted on the iterations a Step is due (or at once when
nothing runs), so the Allocates join the Appends instead of forcing a Step of their own; a new
request waits at most K - 1 iterations for that. A decoding sequence asks for its next block
with at least a block of slack, so with K below the block size it never runs dry while its
Append waits. An executor then sends about one Step per K iterations instead of one nearly
every iteration (at 256 running sequences and block 16, some sequence needs a block almost
every iteration).

The engine reads a decode Step's answer only when it needs it (engine.py), so a sequence's
Append may still be unanswered at the next plans: such a sequence (`unanswered`) decodes and
plans no other op until the answer is read; its Append asked for what it needs next.

A prompt chunk, a sequence being forked, and one whose last block may be shared (copy-on-write)
always send their Append: a sequence never writes into a shared block without the allocator's
copy instruction. With `sparse_steps` off every running sequence sends an Append every
iteration, asking for `lookahead_slots` beyond the token it is about to write (the protocol
before sparse Steps, kept for comparison). Either way a decode normally finds its next slot
already in its mirrored table and the forward pass does not wait for the allocator. When it
does wait (the reserve could not be granted in time), that is a stall, counted. When the pool
is out of blocks for a sequence that has no slot left, the most recently admitted request is
preempted: freed, requeued at the front, and recomputed later (the prefix cache usually still
holds most of it).
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from executor_service.engine.request import Request, Sequence, SequenceStatus
from executor_service.engine.step_plan import StepPlan
from pagedserve.protocol.block_ops import AllocateOp, ForkOp, OpResult, OpStatus, StepResult


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    block_size: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    # Slots an Allocate (and, without sparse Steps, every Append) reserves past its tokens.
    lookahead_slots: int = 4
    # Send a decoding sequence's Append only when its reserve drops below a block.
    sparse_steps: bool = True
    # Iterations an allocator Step may be put off while nothing needs its answer (coalesced
    # Steps, see the module's docstring); 1: a Step whenever an iteration has ops.
    step_interval: int = 1
    # The widest beam search a request may ask for (each beam is a running sequence).
    max_beam_width: int = 16
    # Whole blocks a decoding sequence's Append reserves ahead (sparse Steps). R blocks: an
    # Append every R blocks of output, taking R blocks and publishing R. The allocator's cost
    # per op is about as large as its cost per block, so R = 2 saves it about a quarter, for
    # R - 1 more blocks held ahead by every running sequence.
    reserve_blocks: int = 1


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []          # in admission order
        self.pending_frees: list[str] = []
        self._admissions = itertools.count()
        # Iterations planned since the last one that sent a Step.
        self._since_step = 0
        self.num_preemptions = 0
        self.num_stalls = 0
        # Requests an op refused for good (e.g. a prompt larger than the pool), to report.
        self.errored: list[Request] = []
        # The preempted beam search bringing its beams back in this iteration's plan.
        self._readmitting: Request | None = None
        # Decoding sequences whose Append is in a Step the engine has not read yet (it
        # lingers past its iteration, engine.py): they plan no other op until it is read.
        self.unanswered: set[Sequence] = set()

    # -- requests in and out --------------------------------------------------------------------

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Ends a sequence; its blocks go back in the next Step."""
        if seq.status is SequenceStatus.RUNNING:
            self.pending_frees.append(seq.seq_id)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        request = seq.request
        if request.finished:
            if request in self.running:
                self.running.remove(request)
            elif request in self.waiting:
                self.waiting.remove(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.pending_frees)

    @property
    def num_admitted_seqs(self) -> int:
        """Sequences the admitted requests hold or are about to: a request admitted in this
        very iteration still WAITS for the Allocate it plans, and an n > 1 request forks its
        other choices after its prompt. (Counting only RUNNING sequences let one iteration
        admit every waiting request, past max_num_seqs.)"""
        return sum(map(seqs_of, self.running))

    # -- one iteration --------------------------------------------------------------------------

    def plan(self) -> StepPlan:
        plan = StepPlan()
        self._readmitting = None
        # Forks before frees: a parent that finished at its first token still has the blocks
        # its children are forked from.
        for request in self.running:
            for seq in request.sequences:
                if seq.fork_parent is not None and seq.status is SequenceStatus.WAITING:
                    plan.fork(seq.fork_parent, seq)
        for seq_id in self.pending_frees:
            plan.free(seq_id)
        self.pending_frees.clear()
        budget = self.config.max_num_batched_tokens
        for request in self.running:
            budget = self._plan_request(plan, request, budget)
        step_due = self._since_step + 1 >= self.config.step_interval or not self.running
        if self.waiting and budget > 0 and step_due:
            # Counted once, then kept up as requests are admitted (a count per admission
            # walked every running request again).
            admitted = self.num_admitted_seqs
            while self.waiting and budget > 0:
                request = self.waiting[0]
                needs = seqs_of(request)
                if admitted + needs > self.config.max_num_seqs:
                    break
                admitted += needs
                self.running.append(self.waiting.popleft())
                budget = self._plan_request(plan, request, budget)
        if plan.ops and not (step_due or plan.needs_answer or plan.urgent):
            self._put_off(plan)
        self._since_step = 0 if plan.ops else self._since_step + 1
        return plan

    def _put_off(self, plan: StepPlan) -> None:
        """Keeps this iteration's ops for a later Step: Appends are planned again (their tokens
        stay unreported), Frees wait in pending_frees."""
        deferred = [planned.op.seq_id for planned in plan.ops if planned.seq is None]
        self.pending_frees[:0] = deferred
        plan.ops = []

    def _plan_request(self, plan: StepPlan, request: Request, budget: int) -> int:
        """Plans every sequence of a running request the budget reaches; returns what is left.
        A beam search's decoding beams run together or not at all: the next decision needs
        every beam's logits."""
        if request.beams is not None:
            decoding = sum(seq.is_decoding and seq.status is not SequenceStatus.FINISHED
                           for seq in request.sequences)
            if decoding > budget:
                return budget
        for seq in request.sequences:
            if seq.status is SequenceStatus.FINISHED or budget == 0:
                continue
            if not seq.num_uncomputed:
                # A beam recomputed after a preemption, its logits waiting for its siblings':
                # its computed mark goes to the allocator, whose prefix cache then holds every
                # full block of it for the next beam's Allocate.
                plan.append(seq, 0)
                continue
            if seq.status is SequenceStatus.WAITING and seq.fork_parent is None:
                if request.beams is not None and len(request.sequences) > 1:
                    # Preempted beam searches come back one at a time, in admission order:
                    # two taking turns at blocks could each requeue the other forever.
                    if self._readmitting not in (None, request):
                        break
                    self._readmitting = request
                    if self._beam_recomputing(request):
                        break
                plan.allocate(seq, self._admission_reserve)
                chunk = min(seq.num_uncomputed, budget)
                plan.work.append((seq, chunk))
                if request.beams is not None:
                    budget -= chunk
                    break
            else:
                chunk = self._run(plan, seq, budget)
            budget -= chunk
        return budget

    @staticmethod
    def _beam_recomputing(request: Request) -> bool:
        """Whether a preempted beam search is still recomputing a beam it admitted again. Its
        beams come back one at a time: each then finds the blocks its history shares with the
        beams before it in the prefix cache. Admitted together they would all miss and need
        more blocks than the search ever held at once."""
        return any(seq.status is SequenceStatus.RUNNING and seq.num_uncomputed
                   for seq in request.sequences)

    def _run(self, plan: StepPlan, seq: Sequence, budget: int) -> int:
        """Plans one running (or being-forked) sequence; returns the tokens it computes."""
        if seq in self.unanswered:
            # Its last Append asked for what it needs next, and the engine reads that answer
            # before a pass that would write past the mirrored table.
            plan.work.append((seq, 1))
            return 1
        # Once per running sequence per iteration: the properties are spelt out.
        config = self.config
        uncomputed = len(seq.token_ids) - seq.num_computed
        decoding = uncomputed == 1
        chunk = 1 if decoding else min(uncomputed, budget)
        end = seq.num_computed + chunk
        capacity = len(seq.block_table) * config.block_size
        blocked = seq.fork_parent is not None or seq.may_copy_on_write or capacity < end
        beam = seq.request.beams is not None
        if config.sparse_steps and decoding and not beam:
            # Below a whole block of slots past the token written now, ask for the reserve.
            slack = capacity - end
            if blocked or slack < config.block_size:
                plan.append(seq, config.block_size * config.reserve_blocks)
                # Its reserve would run out before a Step put off now goes out.
                plan.urgent |= slack < config.step_interval
        else:
            lookahead = config.lookahead_slots if end == len(seq.token_ids) else 0
            plan.append(seq, lookahead)
            # A beam reports every token at once and its Step is never put off: a beam chosen
            # twice is forked, and the Fork must find every token of the parent recorded.
            plan.urgent |= beam
            plan.beams |= beam
        if blocked:
            plan.needs_answer = True
            if decoding and seq.fork_parent is None and not seq.may_copy_on_write:
                plan.stalled += 1
        plan.work.append((seq, chunk))
        return chunk

    @property
    def _admission_reserve(self) -> int:
        """Slots an Allocate reserves past the prompt: with coalesced Steps, enough that the
        first decodes' Append can wait for the next due Step."""
        if self.config.step_interval > 1:
            return max(self.config.lookahead_slots, self.config.step_interval + 1)
        return self.config.lookahead_slots

    # -- the Step's answer ----------------------------------------------------------------------

    def apply(self, plan: StepPlan, result: StepResult) -> list[tuple[Sequence, int]]:
        """Mirrors the answer into the sequences. Returns the (sequence, chunk) pairs that must
        run this iteration but got no slot (out of blocks): the engine preempts for them."""
        self.num_stalls += plan.stalled
        stuck: list[Sequence] = []
        for planned, answer in zip(plan.ops, result.results):
            seq = planned.seq
            if seq is None or seq.status is SequenceStatus.FINISHED:
                continue
            if answer.status is not OpStatus.OK:
                self._refused(plan, seq, answer, stuck)
                continue
            if isinstance(planned.op, AllocateOp):
                if seq.request not in self.running:  # a sibling's admission failed: give back
                    self.pending_frees.append(seq.seq_id)
                    continue
                seq.block_table = list(answer.block_table)
                if seq.request.num_preemptions == 0:  # usage reports the first admission's
                    seq.num_cached_tokens = answer.num_cached_tokens
                seq.num_computed = answer.num_cached_tokens
                if seq.request.scoring_prompt:
                    # The cached tokens' logits are wanted too: recompute them from where
                    # the scoring stopped, reading the cached blocks without writing them.
                    seq.rescore_below = seq.num_computed
                    seq.num_computed = min(seq.num_computed, len(seq.request.prompt_logprobs))
                seq.status = SequenceStatus.RUNNING
                if seq.request.admitted < 0:
                    seq.request.admitted = next(self._admissions)
            elif isinstance(planned.op, ForkOp):
                parent = seq.fork_parent
                seq.block_table = list(answer.block_table)
                seq.status, seq.fork_parent = SequenceStatus.RUNNING, None
                # The child shares the blocks of the parent's tokens recorded at the Fork.
                shares_tail = planned.reported % self.config.block_size != 0
                seq.may_copy_on_write = parent.may_copy_on_write = shares_tail
            else:
                self.grown(plan, seq, answer)
            seq.num_reported = planned.reported
        chunks = dict((seq, chunk) for seq, chunk in plan.work)
        plan.work = [(seq, min(chunk, seq.num_uncomputed)) for seq, chunk in plan.work
                     if seq.status is SequenceStatus.RUNNING and seq not in stuck]
        return [(seq, chunks[seq]) for seq in stuck]

    def grown(self, plan: StepPlan, seq: Sequence, answer: OpResult) -> None:
        for src, dst in answer.copies:
            seq.replace_block(src, dst)
            plan.copies.append((src, dst))
        seq.block_table.extend(answer.new_blocks)
        if len(seq.token_ids) > seq.num_reported:
            seq.may_copy_on_write = False  # the shared block was written (or copied) now

    def _refused(self, plan: StepPlan, seq: Sequence, answer: OpResult,
                 stuck: list[Sequence]) -> None:
        request = seq.request
        if answer.status is OpStatus.OUT_OF_BLOCKS and seq.status is SequenceStatus.WAITING:
            # Not admitted: back to the front of the queue, whole, to wait for blocks.
            self.pending_frees += self._requeue(request)
            return
        if answer.status is OpStatus.OUT_OF_BLOCKS:
            # Only the lookahead failed if the slots this iteration writes are covered.
            chunk = next((c for s, c in plan.work if s is seq), 0)
            covered = seq.capacity(self.config.block_size) >= seq.num_computed + chunk
            if chunk and (not covered or seq.may_copy_on_write):
                stuck.append(seq)
            return
        request.error = answer.message or answer.status.name
        self.errored.append(request)
        for other in request.sequences:
            if other.status is not SequenceStatus.FINISHED:
                self.finish(other, "error")

    # -- preemption -----------------------------------------------------------------------------

    def preemption_victim(self) -> Request | None:
        admitted = [request for request in self.running if request.admitted >= 0]
        return max(admitted, key=lambda request: request.admitted, default=None)

    def preempt(self, request: Request) -> list[str]:
        """Takes a request's blocks away: returns the sequence ids to free now. Its tokens
        stay, so it resumes by recomputing them."""
        freed = self._requeue(request)
        request.admitted = -1
        request.num_preemptions += 1
        self.num_preemptions += 1
        return freed

    def _requeue(self, request: Request) -> list[str]:
        """Puts a request back at the front of the queue holding no blocks; returns the ids of
        the sequences whose blocks must be freed. A child not yet forked will be admitted on
        its own (its parent's blocks go too)."""
        freed = []
        for seq in request.sequences:
            if seq.status is SequenceStatus.RUNNING:
                freed.append(seq.seq_id)
                seq.release_blocks()
            seq.fork_parent = None
        if request in self.running:
            self.running.remove(request)
            self.waiting.appendleft(request)
        return freed


def seqs_of(request: Request) -> int:
    """The sequences `request` runs once admitted: its unfinished ones, and the choices (or
    beams) it forks after its prompt if it has not yet."""
    unfinished = sum(seq.status is not SequenceStatus.FINISHED for seq in request.sequences)
    return unfinished if request.forked else unfinished + request.params.num_sequences - 1
