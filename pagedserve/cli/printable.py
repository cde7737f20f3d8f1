"""Model output made safe for a terminal: control characters shown escaped, not sent raw (an
ESC or ^N from a model can recolour the terminal or switch its character set)."""
from __future__ import annotations

import unicodedata

KEPT = frozenset("\n\t")


def printable(text: str) -> str:
    """`text` with every control character (C0, DEL, C1) but newline and tab, and every lone
    surrogate, written as a Python escape: ESC becomes the four characters `\\x1b`. Other
    text, including any language and emoji, is left as it is."""
    if text.isprintable():
        return text
    return "".join(_escape(char) for char in text)


def _escape(char: str) -> str:
    if char in KEPT or unicodedata.category(char) not in ("Cc", "Cs"):
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
