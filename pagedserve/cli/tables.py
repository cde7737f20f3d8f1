"""Plain-text tables for terminal output."""
from __future__ import annotations

from collections.abc import Sequence


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(header)] + [len(row[i]) for row in cells]) for i, header in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) for row in rows) if rows else False
               for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(value.rjust(width) if is_number else value.ljust(width)
                         for value, width, is_number in zip(values, widths, numeric)).rstrip()

    return "\n".join([line(headers), line(["-" * width for width in widths]),
                      *[line(row) for row in cells]])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
