"""The one way a generator under scripts/ writes its page, or checks it is current (--check), so
`make docs` and the freshness tests behave alike for every generated reference. Standard library
only: gen_api_reference.py runs under the code generator's venv."""
from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(page: Path, text: str, check: bool, what: str) -> int:
    """Writes `text` to `page` when it differs; with `check`, writes nothing and returns 1 when
    it differs. `what` names the generated part in the messages ("docs/x.md", "the table of
    docs/x.md")."""
    current = page.read_text() if page.exists() else None
    if check:
        if current != text:
            print(f"{what} is stale: run `make docs` and commit it", file=sys.stderr)
            return 1
        print(f"{what} is current")
        return 0
    if current != text:
        page.write_text(text)
    print(f"wrote {what}" if current != text else f"{what} was already current")
    return 0
