"""One completion's way from token ids to text deltas: incremental detokenization, then stop
strings. What the client receives for a choice comes out of here.

A stop token (end-of-sequence, or one of stop_token_ids) ends the completion without being
part of its text, as in vLLM (where include_stop_str_in_output would keep it): its id,
logprob and count stay. Where a token's text starts (text_offset) is the length of the text
the tokens before it decode to: a token holding the first byte of a character starts where
the character does, and so does the one that completes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gateway.detokenizer import IncrementalDetokenizer
from gateway.stop_strings import StopStringMatcher
from gateway.tokenizer import GatewayTokenizer
from pagedserve.protocol.finish_reason import finish_reason_from_proto, finish_reason_to_proto

FINISH_REASON_STOP = finish_reason_to_proto("stop")


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token_id: int
    token: str
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    token: str
    # None for a prompt's first token: nothing comes before it to score it on.
    logprob: float | None
    top: tuple[TopLogprob, ...]
    # Prompt tokens: the token's rank at its position (1: the most likely).
    rank: int | None = None


@dataclass(slots=True)
class ChoiceDelta:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # "stop", "length", "cancelled" or "error" on the choice's last delta.
    finish_reason: str | None = None
    error: str = ""
    # Beam search and best_of (the choice comes whole at the end): its summed token
    # log-probability and the score it was ranked by.
    cumulative_logprob: float | None = None
    score: float | None = None
    # Where each token of `logprobs` starts in the completion's text.
    text_offsets: list[int] = field(default_factory=list)


class ChoiceStream:
    def __init__(self, index: int, tokenizer: GatewayTokenizer, prompt_token_ids: list[int],
                 stop: tuple[str, ...], skip_special_tokens: bool) -> None:
        self.index = index
        self._tokenizer = tokenizer
        self._detokenizer = IncrementalDetokenizer(tokenizer.tokenizer, skip_special_tokens,
                                                   prompt_token_ids)
        self._stops = StopStringMatcher(stop)
        self.finish_reason: str | None = None
        self.num_tokens = 0
        # Characters decoded so far (ahead of stop strings' holding back).
        self._decoded = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def advance(self, token_ids: list[int], logprobs, executor_finish: int) -> ChoiceDelta:
        """The delta for new tokens (and the executor's finish reason, 0 while running).
        A stop string ends the choice here, whatever the executor goes on generating."""
        delta = ChoiceDelta(self.index, token_ids=list(token_ids),
                            logprobs=[self._logprob(entry) for entry in logprobs])
        self.num_tokens += len(token_ids)
        shown = token_ids
        if executor_finish == FINISH_REASON_STOP and token_ids:
            shown = token_ids[:-1]   # the stop token: not part of the text
        if delta.logprobs:
            text, offsets = self._detokenizer.add_with_offsets(shown)
            # The stop token starts where the text ends.
            offsets += [len(text)] * (len(token_ids) - len(shown))
            delta.text_offsets = [self._decoded + offset for offset in offsets]
        else:
            text = self._detokenizer.add(shown)
        if executor_finish:
            text += self._detokenizer.finish()
        self._decoded += len(text)
        result = self._stops.feed(text)
        delta.text = result.text
        if result.stopped:
            self.finish_reason = delta.finish_reason = "stop"
        elif executor_finish:
            delta.text += self._stops.flush()
            self.finish_reason = delta.finish_reason = finish_reason_from_proto(
                executor_finish)
        return delta

    def end(self, reason: str, error: str = "") -> ChoiceDelta:
        """Ends an unfinished choice from outside (its executor failed, or was cancelled)."""
        self.finish_reason = reason
        return ChoiceDelta(self.index, finish_reason=reason, error=error)

    def _logprob(self, entry) -> TokenLogprob:
        return logprob_with_text(self._tokenizer, entry)


def logprob_with_text(tokenizer: GatewayTokenizer, entry) -> TokenLogprob:
    """An executor's TokenLogprob message with each token's text."""
    def text(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False)
    return TokenLogprob(entry.token_id, text(entry.token_id), entry.logprob,
                        tuple(TopLogprob(top.token_id, text(top.token_id), top.logprob)
                              for top in entry.top),
                        entry.rank if entry.HasField("rank") else None)
