"""Writes the request-field table of docs/api-http.md from gateway/openai_http/fields.py
(`make docs`), or checks it is current (--check). Only the text between the section's two marker
comments is rewritten."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway.openai_http.fields import BOTH, FIELDS, Field, Handling
from scripts.generated_page import write_or_check

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api-http.md"
BEGIN, END = "<!-- field-table:begin -->", "<!-- field-table:end -->"


def table() -> str:
    by_name: dict[str, dict[str, Field]] = {}
    for entry in FIELDS:
        for endpoint in entry.endpoints:
            by_name.setdefault(entry.name, {})[endpoint] = entry
    lines = ["| field | `/v1/completions` | `/v1/chat/completions` | what happens |",
             "|---|---|---|---|"]
    for name, entries in by_name.items():
        cells = [entries[e].handling.value if e in entries else "—" for e in BOTH]
        by_note: dict[str, list[str]] = {}    # endpoints that share a note, in order
        for endpoint, entry in entries.items():
            by_note.setdefault(note(entry), []).append(endpoint)
        notes = [text if len(by_note) == 1 else f"{', '.join(endpoints)}: {text}"
                 for text, endpoints in by_note.items()]
        lines.append(f"| `{name}` | {' | '.join(cells)} | {'; '.join(notes)} |")
    return "\n".join(lines) + "\n"


def note(entry: Field) -> str:
    if entry.handling is Handling.SUPPORTED:
        return "as described above"
    if entry.handling is Handling.IGNORED:
        return f"ignored: {entry.why}"
    accepted = ", ".join(f"`{json.dumps(value)}`" for value in entry.neutral)
    return f"400 \"{entry.refusal()}\"" + (f"; accepted: {accepted}" if accepted else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    page = OUTPUT.read_text()
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    text = page[:start] + "\n" + table() + page[end:]
    return write_or_check(OUTPUT, text, args.check, "the field table of docs/api-http.md")


if __name__ == "__main__":
    sys.exit(main())
