"""Why a completion ended, in the words every layer uses, and its wire value.

The executor's and the gateway's protos each declare a FinishReason enum with the same names
and numbers (a test holds them equal), so one table converts both. OpenAI's words differ for
"cancelled" only; the HTTP layer maps that one itself.
"""
from __future__ import annotations

from typing import Literal

FinishReason = Literal["stop", "length", "cancelled", "error"]

# None: still running. The numbers are FINISH_REASON_* of both protos.
_TO_PROTO: dict[str | None, int] = {None: 0, "stop": 1, "length": 2, "cancelled": 3, "error": 4}
_FROM_PROTO: dict[int, str | None] = {value: word for word, value in _TO_PROTO.items()}


def finish_reason_to_proto(reason: str | None) -> int:
    return _TO_PROTO[reason]


def finish_reason_from_proto(value: int) -> str | None:
    """A number this build does not know (a newer peer's) reads as "error": the choice ended,
    and nothing better can be said of it."""
    return _FROM_PROTO.get(value, "error")
