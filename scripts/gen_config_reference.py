"""Writes docs/configuration.md from the argument parsers (`make docs`), or checks it is current.

The parsers read their defaults from PAGEDSERVE_* variables when they are built, so every such
variable is removed first: the reference shows the built-in defaults, not this machine's.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from scripts.generated_page import write_or_check

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "configuration.md"
# (command as typed, module whose build_parser() it runs)
COMMANDS = [
    ("python -m allocator_service", "allocator_service.server.config"),
    ("python -m executor_service", "executor_service.config"),
    ("python -m gateway", "gateway.config"),
    ("pagedserve up", "pagedserve.cli.up"),
    ("pagedserve generate", "pagedserve.cli.generate"),
    ("pagedctl", "pagedserve.cli.pagedctl"),
]
# `(env NAME)` or `(env NAME, how it is read)` at the end of a help text.
ENV_NOTE = re.compile(r"\s*\(env ([A-Z][A-Z0-9_]*)(?:,\s*([^)]*))?\)\s*$")
INTRO = """\
# Configuration reference

Generated from the argument parsers by `scripts/gen_config_reference.py`; do not edit it by
hand, regenerate it with `make docs` (a test fails when it is stale). A flag given on the
command line wins over its environment variable, which wins over the built-in default shown
here; an environment variable set to the empty string counts as unset.
"""


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}` (positional)"
    if action.nargs == 0:
        return f"`{', '.join(action.option_strings)}`"
    if action.choices is not None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.metavar or action.dest.upper()
    return ", ".join(f"`{option} {metavar}`" for option in action.option_strings)


def default(action: argparse.Action) -> str:
    if not action.option_strings or action.default is None:
        return "—"
    return "*empty*" if action.default == "" else f"`{action.default}`"


def row(action: argparse.Action) -> str:
    help_text = action.help or ""
    note = ENV_NOTE.search(help_text)
    env = "—"
    if note:
        help_text = help_text[:note.start()]
        env = f"`{note.group(1)}`" + (f" ({note.group(2)})" if note.group(2) else "")
    return f"| {flag(action)} | {env} | {cell(default(action))} | {cell(help_text)} |"


def sections(command: str, parser: argparse.ArgumentParser, depth: int = 2,
             summary: str = "") -> Iterator[str]:
    """The command's section, then one per subcommand (and theirs, depth first)."""
    lines = ["#" * depth + f" `{command}`", ""]
    if summary or parser.description:
        lines += [cell(summary or parser.description or ""), ""]
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    # A default of SUPPRESS marks a command's copy of a global option (pagedctl takes them
    # after the command too); the command's own section lists it once.
    actions = [a for a in parser._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
               and a.default != argparse.SUPPRESS]
    if actions:
        lines += ["| flag | environment variable | default | meaning |",
                  "|---|---|---|---|", *map(row, actions), ""]
    else:
        lines += ["No options.", ""]
    yield "\n".join(lines)
    for group in subcommands:
        helps = {choice.dest: choice.help or "" for choice in group._choices_actions}
        for name, subparser in group.choices.items():
            yield from sections(f"{command} {name}", subparser, depth + 1, helps.get(name, ""))


def render() -> str:
    for name in [name for name in os.environ if name.startswith("PAGEDSERVE_")]:
        del os.environ[name]
    parts = [INTRO]
    for command, module in COMMANDS:
        parser = importlib.import_module(module).build_parser()
        parts.extend(sections(command, parser))
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/configuration.md is stale instead of writing it")
    check = parser.parse_args().check
    return write_or_check(OUTPUT, render(), check, str(OUTPUT.relative_to(ROOT)))


if __name__ == "__main__":
    sys.exit(main())
