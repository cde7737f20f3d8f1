"""The penalties' token counts (executor_service/engine/token_counts.py), kept as tokens arrive,
equal counts taken from scratch at every length; bad ids are refused."""
from __future__ import annotations

import pytest
import torch

from executor_service.engine.token_counts import TokenCounts


def test_counts_kept_token_by_token_equal_counts_from_scratch():
    prompt = [5, 1, 5]
    tokens = list(prompt)
    kept = TokenCounts(8, prompt, "cpu")
    for new in ([2], [2, 7, 2], [], [0]):  # one token, several (a resumed sequence), none
        tokens += new
        kept.catch_up(tokens, len(prompt))
        scratch = TokenCounts.of(8, prompt, tokens[len(prompt):], "cpu")
        assert torch.equal(kept.output, scratch.output)
        assert torch.equal(kept.seen(), scratch.seen())
    assert kept.output.tolist() == [1, 0, 3, 0, 0, 0, 0, 1]
    assert kept.seen().tolist() == [True, True, True, False, False, True, False, True]


def test_an_id_outside_the_vocabulary_is_refused_with_the_range():
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 4\), got 0\.\.4"):
        TokenCounts(4, [0, 4], "cpu")
    counts = TokenCounts(4, [0], "cpu")
    with pytest.raises(ValueError, match=r"got -1\.\.-1"):
        counts.catch_up([0, -1], 1)
