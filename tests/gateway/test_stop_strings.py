"""Stop strings in streamed text: held back while they may be starting, never sent, and the
same outcome however the text is split into deltas."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.stop_strings import StopResult, StopStringMatcher


def feed_all(matcher: StopStringMatcher, deltas: list[str]) -> list[StopResult]:
    return [matcher.feed(delta) for delta in deltas]


def test_a_stop_string_split_over_three_deltas_is_held_then_dropped():
    matcher = StopStringMatcher(["</end>"])
    assert feed_all(matcher, ["hello </", "en", "d> more"]) == [
        StopResult("hello "), StopResult(""), StopResult("", stopped=True, matched="</end>")]


def test_a_stop_string_at_the_very_start_sends_nothing():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("STOP and the rest") == StopResult("", stopped=True, matched="STOP")
    assert matcher.flush() == ""


def test_text_in_the_same_delta_before_the_stop_string_is_sent():
    matcher = StopStringMatcher(["\n\n"])
    assert matcher.feed("one\n\ntwo") == StopResult("one", stopped=True, matched="\n\n")


def test_when_one_stop_string_begins_another_the_shorter_ends_first_and_wins():
    assert StopStringMatcher(["abc", "ab"]).feed("xabc") == StopResult("x", True, "ab")
    matcher = StopStringMatcher(["abc", "ab"])
    assert feed_all(matcher, ["xa", "b"]) == [StopResult("x"), StopResult("", True, "ab")]


def test_when_one_stop_string_ends_another_the_longer_wins_so_none_of_it_is_sent():
    assert StopStringMatcher(["bc", "abc"]).feed("xabc") == StopResult("x", True, "abc")


def test_overlapping_stop_strings_the_one_completed_first_wins():
    # "abcd" starts earlier, but "bc" is already complete when "c" arrives.
    assert StopStringMatcher(["abcd", "bc"]).feed("abcd") == StopResult("a", True, "bc")


def test_without_a_match_the_held_tail_is_flushed_at_the_end():
    matcher = StopStringMatcher(["###"])
    assert feed_all(matcher, ["a #", "# b", " c##"]) == [
        StopResult("a "), StopResult("## b"), StopResult(" c")]
    assert matcher.flush() == "##"
    assert matcher.flush() == ""


def test_text_that_looks_like_a_stop_string_then_diverges_is_sent():
    matcher = StopStringMatcher(["STOP"])
    assert feed_all(matcher, ["ST", "O", "RM"]) == [
        StopResult(""), StopResult(""), StopResult("STORM")]


def test_a_match_can_start_inside_the_held_text():
    # Held "aa" could be the start of "aab"; the match begins one character later.
    matcher = StopStringMatcher(["aab"])
    assert feed_all(matcher, ["aa", "ab"]) == [StopResult(""), StopResult("a", True, "aab")]


def test_no_stop_strings_pass_everything_through_at_once():
    matcher = StopStringMatcher([])
    assert matcher.feed("anything <") == StopResult("anything <")
    assert matcher.flush() == ""


def test_feeding_after_a_stop_is_an_error():
    matcher = StopStringMatcher(["x"])
    assert matcher.feed("x").stopped
    with pytest.raises(RuntimeError, match="after a stop string matched"):
        matcher.feed("more")


def test_an_empty_stop_string_is_refused():
    with pytest.raises(ValueError, match="empty stop string"):
        StopStringMatcher(["ok", ""])


def reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """What the stream should come to: cut before the stop string that ends first (the
    longest of those ending at the same character)."""
    for end in range(1, len(text) + 1):
        ending = [stop for stop in stops if text[:end].endswith(stop)]
        if ending:
            stop = max(ending, key=len)
            return text[:end - len(stop)], stop
    return text, None


@settings(max_examples=200, deadline=None)
@given(text=st.text("abc", max_size=24),
       stops=st.lists(st.text("abc", min_size=1, max_size=4), max_size=3),
       cuts=st.lists(st.integers(0, 24), max_size=6))
def test_any_split_of_the_text_gives_the_reference_outcome(text, stops, cuts):
    bounds = [0, *sorted(min(cut, len(text)) for cut in cuts), len(text)]
    deltas = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    matcher = StopStringMatcher(stops)
    sent, matched = "", None
    for delta in deltas:
        result = matcher.feed(delta)
        sent += result.text
        if result.stopped:
            matched = result.matched
            break
    else:
        sent += matcher.flush()
    assert (sent, matched) == reference(text, stops)
