"""What the engine reports after each step: per request, the tokens each choice gained, the
choices that finished and why, and the usage once the whole request is done."""
from __future__ import annotations

from executor_service.engine.request import Request, Sequence
from executor_service.engine.request_output import RequestOutput, SequenceDelta, TokenLogprob, Usage
from executor_service.engine.sampler import TokenLogprobs


class _Report:
    """What one request has to report since the last drain."""
    __slots__ = ("request", "deltas", "done", "scored")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.deltas: dict[int, SequenceDelta] = {}     # by choice index
        self.done = False                               # its last report: usage, error
        self.scored = False                             # its prompt logprobs go out


class OutputCollector:
    def __init__(self) -> None:
        self._reports: dict[str, _Report] = {}

    def _report(self, request: Request) -> _Report:
        report = self._reports.get(request.request_id)
        if report is None:
            report = self._reports[request.request_id] = _Report(request)
        return report

    def _delta(self, seq: Sequence) -> SequenceDelta:
        # Beams share choice index 0, so they share one delta too.
        deltas = self._report(seq.request).deltas
        delta = deltas.get(seq.index)
        if delta is None:
            delta = deltas[seq.index] = SequenceDelta(seq.index, [])
        return delta

    def token(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None) -> None:
        if seq.request.params.ranks_samples:
            return   # a best_of sample: reported whole, if it ranks, by choices()
        delta = self._delta(seq)
        delta.token_ids.append(token)
        if logprobs is not None:
            if delta.logprobs is None:
                delta.logprobs = []
            delta.logprobs.append(TokenLogprob(token, logprobs.logprob, logprobs.top))

    def choices(self, request: Request) -> None:
        """A request whose choices were decided at its end (beam search, best_of): each comes
        whole, with its tokens, why it ended and its cumulative log-probability."""
        deltas = self._report(request).deltas
        for index, choice in enumerate(request.final_choices or []):
            deltas[index] = SequenceDelta(index, list(choice.token_ids),
                                          finish_reason=choice.finish_reason,
                                          cumulative_logprob=choice.cumulative_logprob,
                                          score=choice.score, logprobs=choice.logprobs)

    def prompt_logprobs(self, request: Request) -> None:
        """The request's prompt is scored: its prompt logprobs go out in the next report."""
        self._report(request).scored = True

    def finished(self, seq: Sequence) -> None:
        params = seq.request.params
        if params.ranks_samples and (seq.index >= params.n or seq.finish_reason in ("stop",
                                                                                     "length")):
            # A best_of sample's natural end is reported with the ranked choices; a cancel or
            # an error is reported for the n choices the client asked for.
            return
        self._delta(seq).finish_reason = seq.finish_reason

    def request_done(self, request: Request) -> None:
        self._report(request).done = True

    def pending(self) -> bool:
        return bool(self._reports)

    def drain(self) -> list[RequestOutput]:
        outputs = []
        for request_id, report in self._reports.items():
            request, deltas, done = report.request, report.deltas, report.done
            outputs.append(RequestOutput(
                request_id,
                [deltas[index] for index in sorted(deltas)] if len(deltas) > 1
                else list(deltas.values()),
                finished=done, usage=usage(request) if done else None,
                error=request.error if done else None,
                prompt_logprobs=request.prompt_logprobs if report.scored else None))
        self._reports = {}
        return outputs


def usage(request: Request) -> Usage:
    """Completion tokens count what is returned: every choice's tokens (the beams and samples
    a beam search or best_of discarded are not counted)."""
    if request.final_choices is not None:
        completion = sum(len(choice.token_ids) for choice in request.final_choices)
    else:
        completion = sum(len(seq.output_token_ids) for seq in request.sequences)
    cached = request.sequences[0].num_cached_tokens if request.sequences else 0
    return Usage(prompt_tokens=len(request.prompt_token_ids), completion_tokens=completion,
                 cached_tokens=cached)
