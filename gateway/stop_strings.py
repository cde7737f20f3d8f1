"""Finds the client's stop strings in streamed text, holding back what may be the start of one.

Which match wins, when stop strings overlap: the one that is complete first, i.e. ends at the
earliest character; among those ending at the same character, the longest. The stream stops
the moment any stop string has appeared, and no part of any stop string is ever sent. So the
result never depends on how the text was split into deltas:

    stops "ab", "abc" on "xabc"  -> "x", matched "ab"  ("abc" can never win: "ab" ends first)
    stops "bc", "abcd" on "abcd" -> "a", matched "bc"
    stops "abc", "bc" on "xabc"  -> "x", matched "abc" (both end at "c": the longer one)

After a match the stream is over: a further `feed` is a caller bug and raises RuntimeError;
`flush` returns "" (the text after the match is dropped with it).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopResult:
    text: str                   # may be sent now; when stopped, everything before the match
    stopped: bool = False       # a stop string matched: the stream ends after `text`
    matched: str | None = None  # the stop string that matched, when stopped


class StopStringMatcher:
    def __init__(self, stop: Sequence[str]) -> None:
        if any(not s for s in stop):
            raise ValueError("an empty stop string would match before any text")
        self._stop = tuple(dict.fromkeys(stop))
        self._held = ""          # a suffix of the text so far that begins some stop string
        self._stopped = False

    def feed(self, text: str) -> StopResult:
        """Takes the next delta; returns what may be sent. Held text never contains a whole
        stop string, and what is sent can never turn out to be part of one."""
        if self._stopped:
            raise RuntimeError("feed() after a stop string matched: the stream is over")
        pending = self._held + text
        match = self._first_match(pending)
        if match is not None:
            start, stop = match
            self._stopped, self._held = True, ""
            return StopResult(pending[:start], stopped=True, matched=stop)
        cut = len(pending) - self._partial_stop_length(pending)
        self._held = pending[cut:]
        return StopResult(pending[:cut])

    def flush(self) -> str:
        """At the end of the stream: the held text, which can no longer become a stop string."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        """(start, stop string) of the match that ends first, the longest on a tie."""
        best: tuple[int, int, str] | None = None
        for stop in self._stop:
            # A string's first occurrence is also the one that ends first.
            start = text.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        return None if best is None else (best[1], best[2])

    def _partial_stop_length(self, text: str) -> int:
        """Length of the longest suffix of `text` that a stop string starts with (and is
        longer than): the earliest place a later match could begin."""
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
