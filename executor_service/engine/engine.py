"""The engine: requests in, token deltas out, one iteration per `step()`.

An iteration plans (scheduler.py), sends its block ops in one Step when it has any (a steady
decode mostly has none: Steps are sparse), computes (model_runner.py) and samples
(sampler.py). When nothing in the forward pass depends on the Step's answer (every running
sequence already has its slots mirrored, nothing is admitted, forked or copied), the forward
pass and the sampling run while the Step is in flight: that is how lookahead keeps decode off
the allocator's critical path. A Step of decoding sequences' Appends (and Frees) stays in
flight after its iteration, through as many more as it can: its answer is read just before
the next Step goes out (one Step in flight at a time, in order), or before a pass that
writes a slot only that answer grants, or when nothing is left to run. Until then its
sequences plan no other op (Scheduler.unanswered): their Appends already asked for what they
need next. So at a few ms an iteration, coalesced Steps have several iterations to come back
in, not one.

The gRPC executor service drives this same class from its serving loop; tests and benchmarks
drive it directly (with the allocator core in-process, see block_allocator.py).
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence as Seq

import torch

from executor_service.engine.beam_search import BeamSearch, Hypothesis
from executor_service.engine.block_allocator import BlockAllocator, StepHandle
from executor_service.engine.grammar import GrammarCompiler, UnreadableTokenizer, accept_token
from executor_service.engine.model_runner import ModelRunner
from executor_service.engine.outputs import OutputCollector
from executor_service.engine.request import Beams, Request, Sequence, SequenceStatus
from executor_service.engine.request_output import RequestOutput, TokenLogprob
from executor_service.engine.sampler import Sampler, SamplingRow, child_seed, make_generator
from executor_service.engine.scheduler import Scheduler, SchedulerConfig
from executor_service.engine.stages import ForwardPass, TokenSampler
from executor_service.engine.step_inputs import StepInputs
from executor_service.engine.step_plan import StepPlan, append_op
from executor_service.engine.stop_check import finish_reason_after
from executor_service.engine.token_counts import TokenCounts
from executor_service.engine.token_mask import NO_MASKS, TokenMasks, TokenMaskWorker
from executor_service.model.causal_lm import CausalLM
from pagedserve.common.errors import AlreadyExists, InvalidArgument, NotFound
from pagedserve.protocol.block_ops import AppendOp, FreeOp, OpStatus
from pagedserve.protocol.sampling_params import SamplingParams

log = logging.getLogger(__name__)

# Why structured output is refused by an engine built without the model's tokenizer.json.
NO_TOKENIZER = ("structured output needs the model's tokenizer, which this engine was built "
                "without")


def blocks_per_seq(max_model_len: int, config: SchedulerConfig) -> int:
    """The most blocks a sequence's table holds: its window plus the reserved lookahead."""
    return -(-(max_model_len + config.lookahead_slots) // config.block_size) + 1


class Engine:
    def __init__(self, runner: ForwardPass, sampler: TokenSampler, allocator: BlockAllocator,
                 scheduler_config: SchedulerConfig, *, vocab_size: int, max_model_len: int,
                 eos_token_ids: Seq[int], grammars: GrammarCompiler | None = None,
                 no_grammars_reason: str = NO_TOKENIZER) -> None:
        """An engine over any forward pass and sampler: `for_model` builds the real ones; the
        fleet simulator (bench/fleet/) passes a timed wait and seeded random tokens.
        `grammars` compiles structured output for the model's tokenizer; None refuses it,
        saying `no_grammars_reason`."""
        self.runner, self.sampler, self.allocator = runner, sampler, allocator
        self.grammars = grammars
        self.no_grammars_reason = no_grammars_reason
        self.token_masks = TokenMaskWorker(vocab_size) if grammars is not None else None
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.scheduler = Scheduler(scheduler_config)
        self.requests: dict[str, Request] = {}
        self.outputs = OutputCollector()
        self._arrivals = itertools.count()
        # Requests finished and forgotten since the last report, detached once it is made.
        self._forgotten: list[Request] = []
        # Iterations run, and Steps sent to the allocator (fewer: most decodes need none).
        self.num_iterations = 0
        self.num_steps = 0
        # A Step still in flight after its iteration (it lingers), and the plan it answers,
        # until its answer is needed (step()).
        self._in_flight: tuple[StepPlan, StepHandle] | None = None

    @classmethod
    def for_model(cls, model: CausalLM, kv_cache: torch.Tensor, allocator: BlockAllocator,
                  scheduler_config: SchedulerConfig, *, max_model_len: int,
                  eos_token_ids: Seq[int], sampler_seed: int | None = None,
                  tokenizer_json: str | None = None) -> Engine:
        """The serving engine: `model` computing into `kv_cache`, the real sampler; structured
        output when given the checkpoint's tokenizer.json text."""
        inputs = StepInputs(scheduler_config.max_num_seqs,
                            scheduler_config.max_num_batched_tokens,
                            blocks_per_seq(max_model_len, scheduler_config),
                            scheduler_config.block_size, kv_cache.device)
        grammars, no_grammars_reason = None, NO_TOKENIZER
        if tokenizer_json is not None:
            try:
                grammars = GrammarCompiler(tokenizer_json, model.config.vocab_size,
                                           eos_token_ids)
            except UnreadableTokenizer as error:
                # A tokenizer the grammar engine cannot read costs structured output, not the
                # whole executor.
                no_grammars_reason = str(error)
                log.warning("%s; serving free text only", error)
        return cls(ModelRunner(model, kv_cache, inputs), Sampler(sampler_seed), allocator,
                   scheduler_config, vocab_size=model.config.vocab_size,
                   max_model_len=max_model_len, eos_token_ids=eos_token_ids,
                   grammars=grammars, no_grammars_reason=no_grammars_reason)

    # -- requests -------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: Seq[int], params: SamplingParams,
                    cache_salt: str = "") -> None:
        if request_id in self.requests:
            raise AlreadyExists(f"request {request_id!r} is already running")
        if not prompt_token_ids:
            raise InvalidArgument("the prompt must hold at least one token")
        bad = next((t for t in prompt_token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidArgument(f"prompt token {bad} is outside the vocabulary "
                                  f"[0, {self.vocab_size})")
        if len(prompt_token_ids) >= self.max_model_len:
            raise InvalidArgument(f"the prompt has {len(prompt_token_ids)} tokens; the context "
                                  f"window is {self.max_model_len}, leaving no room to generate")
        params.validate(self.vocab_size)
        if params.num_sequences > self.scheduler.config.max_num_seqs:
            what = (f"beam_width = {params.beam_width} beams" if params.beam_search
                    else f"best_of = {params.best_of} samples" if params.ranks_samples
                    else f"n = {params.n} choices")
            raise InvalidArgument(f"{what} are more sequences than this "
                                  f"executor runs at once (max_num_seqs "
                                  f"{self.scheduler.config.max_num_seqs})")
        matcher = self._matcher(params)
        request = Request(request_id, list(prompt_token_ids), params, cache_salt,
                          arrival=next(self._arrivals))
        generator = None if params.seed is None else \
            make_generator(params.seed, self.runner.device)
        first = Sequence(f"{request_id}#0", request, 0, list(prompt_token_ids),
                         len(prompt_token_ids), generator=generator, matcher=matcher)
        request.sequences.append(first)
        if params.beam_search:
            request.beams = Beams(self._beam_search(params, len(prompt_token_ids)),
                                  [first] * params.beam_width)
        self.requests[request_id] = request
        self.scheduler.add(request)

    def _matcher(self, params: SamplingParams):
        """The first sequence's grammar matcher (compiled now, so a bad schema is refused
        before anything runs), or None for free text."""
        if params.structured is None:
            return None
        if self.grammars is None:
            raise InvalidArgument(self.no_grammars_reason)
        return self.grammars.matcher(params.structured)

    def _beam_search(self, params: SamplingParams, num_prompt_tokens: int) -> BeamSearch:
        width_limit = self.scheduler.config.max_beam_width
        if params.beam_width > width_limit:
            raise InvalidArgument(f"beam_width {params.beam_width} is above this executor's "
                                  f"maximum ({width_limit}, --max-beam-width)")
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos
                                              else set(self.eos_token_ids))
        search = BeamSearch(params.beam_width, length_penalty=params.length_penalty,
                            early_stopping=params.early_stopping,
                            num_prompt_tokens=num_prompt_tokens,
                            max_length=min(num_prompt_tokens + params.max_tokens,
                                           self.max_model_len),
                            stop_token_ids=stops, device=self.runner.device)
        if search.keep > self.vocab_size:
            raise InvalidArgument(f"beam_width {params.beam_width} with {len(stops)} stop "
                                  f"tokens needs {search.keep} candidates per step; the "
                                  f"vocabulary has {self.vocab_size}")
        return search

    def abort(self, request_id: str) -> None:
        """Cancels a request; its blocks go back in the next Step."""
        request = self.requests.get(request_id)
        if request is None:
            raise NotFound(f"no running request {request_id!r}")
        request.cancelled = True
        for seq in request.sequences:
            if seq.status is not SequenceStatus.FINISHED:
                self.scheduler.finish(seq, "cancelled")
                self.outputs.finished(seq)
        self._collect_finished(request)

    def has_work(self) -> bool:
        # A Step still in flight is work: its answer may end or preempt a request.
        return (self.scheduler.has_work() or self.outputs.pending()
                or self._in_flight is not None)

    def settle(self) -> None:
        """Reads the answer of a Step still in flight (one may linger past its iteration, see
        step()), as before the engine is put away. A serving loop need not: it steps while
        has_work()."""
        self._settle()

    def drain_outputs(self) -> list[RequestOutput]:
        """What happened outside step() (cancellations) that has not been reported yet."""
        return self._drain()

    # -- the pool -------------------------------------------------------------------------------

    def register_pool(self, num_blocks: int, model_fingerprint: str) -> int:
        """Registers this engine's KV cache with the allocator; returns the epoch."""
        self.num_blocks, self.model_fingerprint = num_blocks, model_fingerprint
        return self.allocator.register(num_blocks, self.scheduler.config.block_size,
                                       model_fingerprint)

    def restart_on_new_pool(self) -> int:
        """The allocator forgot our pool (it restarted without durable state, or our lease
        lapsed): no block we hold is ours any more. Every running request goes back to the
        front of the queue, keeping its tokens, to be recomputed on a fresh registration."""
        self._drop_in_flight()  # its answer, if any, is about the old pool
        for request in sorted(self.scheduler.running, key=lambda r: r.admitted):
            self.scheduler.preempt(request)  # nothing to free: the old pool is gone
        self.scheduler.pending_frees.clear()
        return self.register_pool(self.num_blocks, self.model_fingerprint)

    def fail_all(self, message: str) -> list[RequestOutput]:
        """Ends every request with an error (an iteration failed in a way we cannot retry)."""
        # A Step still in flight is not read: every sequence it was for ends here, and their
        # Frees follow it to the allocator.
        self._drop_in_flight()
        for request in list(self.requests.values()):
            request.error = message
            for seq in request.sequences:
                if seq.status is not SequenceStatus.FINISHED:
                    self.scheduler.finish(seq, "error")
                    self.outputs.finished(seq)
            self._collect_finished(request)
        return self._drain()

    # -- one iteration --------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self._in_flight is not None and self._slot_awaits_answer():
            self._settle()
        plan = self.scheduler.plan()
        if not plan.ops and not plan.work:
            self._settle()  # nothing left to run: nothing to keep the answer out for
            return self._drain()
        self.num_iterations += 1
        # A steady decode mostly has nothing for the allocator: then no Step goes out at all.
        handle = overlapped = None
        if plan.ops:
            # One Step in flight at a time, answered in order: the one still out is read first.
            self._settle(before=plan)
            self.num_steps += 1
            handle = self.allocator.submit(plan.block_ops())
        if plan.needs_answer:
            self._apply(plan, handle.result())
            masks = self._start_masks(plan)
            logits, sampled = self.runner.execute(plan.work, plan.copies)
        else:
            masks = self._start_masks(plan)
            logits, sampled = self.runner.execute(plan.work, plan.copies)
            # Sampling needs nothing of the answer either, but for a beam search's decision:
            # the Step has the pass and the sampling to come back in, and longer if it lingers.
            if handle is not None and plan.beams:
                self._apply(plan, handle.result())
            elif handle is not None:
                overlapped = handle
        try:
            self._report_prompt_scores(plan.work)
            if logits is not None:
                self._sample(logits, sampled, masks.wait())
        finally:
            # Even when sampling failed: the serving loop then fails the requests and goes
            # on, and the next iteration must not plan around an answer never mirrored.
            if overlapped is not None:
                self._linger_or_mirror(plan, overlapped)
        return self._drain()

    def _linger_or_mirror(self, plan: StepPlan, handle: StepHandle) -> None:
        """At an iteration's end: keeps its Step in flight past it when only sequences now
        decoding (or finished) have ops in it, else mirrors its answer now (the tokens are
        recorded: a sequence that stopped at its token is skipped, a preemption the answer
        makes keeps that token for the recomputation). A decode needs the answer only once its
        mirrored slots run out; a prompt's next chunk is planned from what the answer updates.
        A Fork planned while a parent's Append lingers is safe: the
        Append's tokens were all recorded with the Allocate, and the lingering Step is read
        (and reaches the allocator) before the Fork's. Without sparse Steps every sequence
        appends every iteration, so the next Step is due at once and nothing lingers."""
        if self.scheduler.config.sparse_steps and all(
                planned.seq is None or planned.seq.is_decoding
                or planned.seq.status is SequenceStatus.FINISHED for planned in plan.ops):
            self._in_flight = (plan, handle)
            self.scheduler.unanswered = {planned.seq for planned in plan.ops
                                         if planned.seq is not None}
        else:
            self._apply(plan, handle.result())

    def _slot_awaits_answer(self) -> bool:
        """Whether a sequence of the lingering Step would write, this iteration, a slot past
        its mirrored table: only that Step's answer grants it (or refuses it, and then the
        scheduler must plan for the sequence afresh)."""
        block_size = self.scheduler.config.block_size
        return any(seq.status is SequenceStatus.RUNNING
                   and seq.capacity(block_size) <= seq.num_computed
                   for seq in self.scheduler.unanswered)

    def _settle(self, before: StepPlan | None = None) -> None:
        """Mirrors the answer of the Step still in flight past its iteration, if there is one.
        Its pass is long done: the answer only updates the mirror, and a reserve it refused is
        asked for again by the next plans (a sequence whose slot it held was read before that
        slot's pass, see step()). `before`: the plan about to go out with the next Step, whose
        work loses any sequence the answer ended."""
        if self._in_flight is None:
            return
        plan, handle = self._in_flight
        self._drop_in_flight()
        plan.work = []
        self._apply(plan, handle.result())
        if before is not None:
            before.work = [(seq, chunk) for seq, chunk in before.work
                           if seq.status is SequenceStatus.RUNNING]

    def _drop_in_flight(self) -> None:
        self._in_flight = None
        self.scheduler.unanswered = set()

    def _start_masks(self, plan: StepPlan) -> TokenMasks:
        """Structured output's masks for the sequences this iteration samples (those whose
        chunk reaches their last token), computed on a worker thread during the forward pass:
        they depend only on tokens already accepted (token_mask.py)."""
        if self.token_masks is None:
            return NO_MASKS
        return self.token_masks.start(seq for seq, chunk in plan.work
                                      if chunk == seq.num_uncomputed)

    def _report_prompt_scores(self, work: list[tuple[Sequence, int]]) -> None:
        """Reports the prompt logprobs of requests whose prompt is now scored (the model
        runner scores it as the prompt is computed)."""
        for seq, _ in work:
            request = seq.request
            if (request.params.prompt_logprobs is not None
                    and not request.prompt_logprobs_reported and not request.scoring_prompt):
                request.prompt_logprobs_reported = True
                self.outputs.prompt_logprobs(request)

    def _apply(self, plan: StepPlan, result) -> None:
        for seq, chunk in self.scheduler.apply(plan, result):
            self._make_room(plan, seq, chunk)
        for request in self.scheduler.errored:
            self._collect_finished(request)
        self.scheduler.errored.clear()

    def _make_room(self, plan: StepPlan, seq: Sequence, chunk: int) -> None:
        """Preempts the most recently admitted requests until `seq` gets the blocks it needs
        this iteration, or is itself the one preempted."""
        while seq.status is SequenceStatus.RUNNING:
            victim = self.scheduler.preemption_victim()
            freed = self.scheduler.preempt(victim)
            plan.work = [(s, c) for s, c in plan.work if s.request is not victim]
            ops = [FreeOp(seq_id) for seq_id in freed]
            if victim is seq.request:
                self.allocator.submit(ops).result()
                return
            ops.append(append_op(seq, 0))
            answer = self.allocator.submit(ops).result().results[-1]
            if answer.status is OpStatus.OK:
                self.scheduler.grown(plan, seq, answer)
                seq.num_reported = len(seq.token_ids)
                plan.work.append((seq, chunk))
                return

    def _sample(self, logits: torch.Tensor, sampled: list[Sequence],
                masks: TokenMasks = NO_MASKS) -> None:
        rows: list[SamplingRow] = []
        # (sequence, choice index it produces, that choice's generator), one per row
        owners: list[tuple[Sequence, int, torch.Generator | None]] = []
        # The logits row each row reads.
        positions: list[int] = []
        deciding: dict[str, Request] = {}
        for position, seq in enumerate(sampled):
            request = seq.request
            if seq.status is not SequenceStatus.RUNNING:
                continue
            if request.beams is not None:
                request.beams.rows[seq] = torch.log_softmax(
                    logits[position].to(torch.float32), dim=-1)
                deciding[request.request_id] = request
                continue
            params = request.params
            fanout = params.num_sequences if seq.index == 0 and not request.forked else 1
            # A fanout's children draw their first token from the parent's history.
            counts = self._token_counts(seq) if params.has_penalties else None
            mask = masks.row(seq)
            for index in range(fanout):
                generator = seq.generator if index == 0 else self._child_generator(request, index)
                rows.append(SamplingRow(params, (), (), generator, counts, token_mask=mask))
                owners.append((seq, index, generator))
                positions.append(position)
        for request in deciding.values():
            if request.beams.ready():
                self._decide_beams(request)
        if not rows:
            return
        # Mostly every sequence sampled gives one row, in order: the logits go as they are
        # (picking them would copy [batch, vocab] floats for nothing).
        if positions != list(range(len(sampled))):
            logits = logits[torch.tensor(positions, device=logits.device)]
        result = self.sampler.sample(logits, rows)
        # Every child exists before any token is recorded: a parent that stops at its first
        # token must not end the request before its siblings exist.
        accepted = []
        for (seq, index, generator), token, logprobs in zip(owners, result.token_ids,
                                                            result.logprobs):
            if index == 0:
                seq.token_ids.append(token)
            else:
                seq = self._fork_child(seq, index, token, generator)
            accepted.append((seq, token, logprobs))
        for seq in sampled:
            if seq.index == 0:
                seq.request.forked = True
        for seq, token, logprobs in accepted:
            self._record(seq, token, logprobs)

    def _decide_beams(self, request: Request) -> None:
        """One beam-search decision, carried out on the sequences: the first continuation of a
        beam goes on in its sequence, every further one is a child forked from it (the Fork
        and the children's Appends go in the next Step, sharing every full block and copying
        only the last, partly filled one), and a beam no continuation chose is freed."""
        beams = request.beams
        order = beams.order
        log_probs = torch.stack([beams.rows[seq] for seq in order])
        continuations = beams.search.step(log_probs, [seq.output_token_ids for seq in order])
        beams.rows.clear()
        request.forked = True
        if beams.search.done:
            self._finish_beams(request)
            return
        lengths = {seq: len(seq.token_ids) for seq in order}
        next_order: list[Sequence] = []
        for continuation in continuations:
            parent = order[continuation.parent]
            if parent in next_order:
                next_order.append(self._fork_beam(parent, lengths[parent], continuation.token_id))
            else:
                parent.token_ids.append(continuation.token_id)
                next_order.append(parent)
        for seq in set(order) - set(next_order):
            self.scheduler.finish(seq, "dropped")
            request.sequences.remove(seq)
        beams.order = next_order

    def _fork_beam(self, parent: Sequence, length: int, token: int) -> Sequence:
        """A new beam: the parent's first `length` tokens and `token`. The Fork gives the child
        the blocks of the tokens the allocator has recorded for the parent, so all `length`
        must be recorded first (beams send an Append every iteration; only one whose reserve
        was refused for want of blocks may be a token behind)."""
        request = parent.request
        if parent.num_reported < length:
            self._record_tokens(parent, length)
        # The lowest id no live beam and no beam still to be freed holds: ids stay below
        # 2 * width, as short as the choices' (the allocator bounds id lengths).
        taken = {seq.seq_id for seq in request.sequences} | set(self.scheduler.pending_frees)
        seq_id = next(f"{request.request_id}#{serial}" for serial in itertools.count(1)
                      if f"{request.request_id}#{serial}" not in taken)
        child = Sequence(seq_id, request, 0, parent.token_ids[:length] + [token],
                         parent.num_prompt_tokens, num_computed=length, num_reported=length,
                         num_cached_tokens=parent.num_cached_tokens, fork_parent=parent)
        request.sequences.append(child)
        return child

    def _record_tokens(self, seq: Sequence, length: int) -> None:
        """Reports a sequence's computed tokens up to `length` with no reserve, in a Step of
        its own. Their slots are in its table already and not shared (it computed them), so
        the allocator needs no block for it."""
        answer = self.allocator.submit([AppendOp(
            seq.seq_id, tuple(seq.token_ids[seq.num_reported:length]), 0, length)]
        ).result().results[0]
        if answer.status is not OpStatus.OK:
            raise RuntimeError(f"the allocator refused to record {seq.seq_id}'s computed "
                               f"tokens: {answer.status.name} {answer.message}")
        seq.num_reported = length

    def _finish_beams(self, request: Request) -> None:
        """The search is over: the beams' blocks go back, the best n hypotheses are the
        request's choices."""
        request.final_choices = request.beams.search.best(request.params.n)
        for seq in list(request.sequences):
            if seq.status is not SequenceStatus.FINISHED:
                self.scheduler.finish(seq, "dropped")
        self.outputs.choices(request)
        self._collect_finished(request)

    def _rank_samples(self, request: Request) -> None:
        """best_of: every sample has finished; the n with the highest summed log-probability
        are the choices, best first (the earlier sample first on a tie)."""
        samples = sorted(request.sequences, key=lambda seq: (-seq.cumulative_logprob, seq.index))
        request.final_choices = [
            Hypothesis(seq.output_token_ids, seq.cumulative_logprob, seq.cumulative_logprob,
                       seq.finish_reason, seq.logprobs if request.params.logprobs is not None
                       else None)
            for seq in samples[:request.params.n]]
        self.outputs.choices(request)

    def _token_counts(self, seq: Sequence) -> TokenCounts:
        if seq.token_counts is None:
            seq.token_counts = TokenCounts(self.vocab_size, seq.request.prompt_token_ids,
                                           self.runner.device)
        seq.token_counts.catch_up(seq.token_ids, seq.num_prompt_tokens)
        return seq.token_counts

    def _child_generator(self, request: Request, index: int) -> torch.Generator | None:
        if request.params.seed is None:
            return None
        return make_generator(child_seed(request.params.seed, index), self.runner.device)

    def _fork_child(self, parent: Sequence, index: int, token: int,
                    generator: torch.Generator | None) -> Sequence:
        """Choice `index` of an n > 1 request: the prompt's blocks come from a Fork of
        `parent` in the next Step, its first token was sampled from the parent's last logits
        with `generator`, which goes on drawing its later tokens."""
        request = parent.request
        prompt = request.prompt_token_ids
        child = Sequence(f"{request.request_id}#{index}", request, index, prompt + [token],
                         len(prompt), generator=generator,
                         num_computed=len(prompt), num_reported=len(prompt),
                         fork_parent=parent)
        if parent.matcher is not None:
            # Before the parent accepts its own first token: both were drawn from its state.
            child.matcher = parent.matcher.deep_copy()
        request.sequences.append(child)
        return child

    def _record(self, seq: Sequence, token: int, logprobs) -> None:
        self.outputs.token(seq, token, logprobs)
        params = seq.request.params
        if params.ranks_samples:
            seq.cumulative_logprob += logprobs.logprob
            if params.logprobs is not None:
                seq.logprobs.append(TokenLogprob(token, logprobs.logprob, logprobs.top))
        num_tokens = len(seq.token_ids)
        reason = finish_reason_after(seq.request.params, token,
                                     num_tokens - seq.num_prompt_tokens, self.eos_token_ids,
                                     num_tokens=num_tokens, max_model_len=self.max_model_len)
        # A complete grammar's mask allows only EOS, so the sequence ends on an EOS as any
        # other (the gateway drops a "stop" finish's last token); ignore_eos yields here.
        if (seq.matcher is not None and accept_token(seq.matcher, token)
                and token in self.eos_token_ids):
            reason = "stop"
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self.outputs.finished(seq)
            self._collect_finished(seq.request)

    def _collect_finished(self, request: Request) -> None:
        if request.finished and request.request_id in self.requests:
            if request.params.ranks_samples and not request.cancelled and request.error is None:
                self._rank_samples(request)
            for seq in request.sequences:
                if seq.finish_reason == "error":
                    self.outputs.finished(seq)
            self.outputs.request_done(request)
            del self.requests[request.request_id]
            self._forgotten.append(request)

    def _drain(self) -> list[RequestOutput]:
        """The outputs since the last report; the requests that ended are detached after
        their last output was made from them (the usage reads their sequences)."""
        outputs = self.outputs.drain()
        for request in self._forgotten:
            request.detach()
        self._forgotten.clear()
        return outputs
