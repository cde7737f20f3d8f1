"""docs/configuration.md is current, and every service flag's `(env NAME)` is true."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import allocator_service.server.config
import executor_service.config
import gateway.config
from executor_service.config import parse_size

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"allocator": allocator_service.server.config, "executor": executor_service.config,
            "gateway": gateway.config}
ENV_NOTE = re.compile(r"\(env ([A-Z][A-Z0-9_]*)(?:, [^)]*)?\)$")
# Service flags that read no environment variable (none today).
WITHOUT_ENV: set[tuple[str, str]] = set()
# Read by parse_config rather than as the flag's default; tested on its own below.
READ_IN_PARSE_CONFIG = {("gateway", "--api-key")}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions
            if action.option_strings and not isinstance(action, argparse._HelpAction)]


def env_options() -> list:
    """(service, flag, variable) for every service flag whose help names a variable."""
    found = []
    for service, module in SERVICES.items():
        for action in options(module.build_parser()):
            note = ENV_NOTE.search(action.help or "")
            if note and (service, action.option_strings[0]) not in READ_IN_PARSE_CONFIG:
                flag = action.option_strings[0]
                found.append(pytest.param(service, flag, note.group(1), id=f"{service}{flag}"))
    return found


def without_pagedserve_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("PAGEDSERVE_")}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in [key for key in os.environ if key.startswith("PAGEDSERVE_")]:
        monkeypatch.delenv(key)
    return monkeypatch


def test_configuration_reference_is_current() -> None:
    check = subprocess.run([sys.executable, "-m", "scripts.gen_config_reference", "--check"],
                           cwd=ROOT, env=without_pagedserve_env(), capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 0, (
        f"docs/configuration.md is stale; run `make docs`\n{check.stdout}{check.stderr}")


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_service_flag_names_its_environment_variable(service: str) -> None:
    unnamed = [action.option_strings[0] for action in options(SERVICES[service].build_parser())
               if not ENV_NOTE.search(action.help or "")
               and (service, action.option_strings[0]) not in WITHOUT_ENV]
    assert unnamed == [], f"{service} flags whose help lacks a trailing (env NAME)"


def value_from_env(action: argparse.Action) -> tuple[str, object]:
    """A valid value other than the default: (as the variable spells it, as parsed)."""
    if isinstance(action, argparse._StoreTrueAction):
        return "1", True
    if action.choices is not None:
        choice = next(choice for choice in action.choices if choice != action.default)
        return str(choice), choice
    if action.type is int:
        return str(action.default + 1), action.default + 1
    if action.type is float:
        return "0.75", 0.75
    if action.type is parse_size:
        return "64M", 64 * 1024 ** 2
    assert action.type is None, f"{action.option_strings[0]}: no sample value for {action.type}"
    return "x-from-env", "x-from-env"


@pytest.mark.parametrize("service, flag, variable", env_options())
def test_environment_variable_sets_the_flag_default(clean_env: pytest.MonkeyPatch, service: str,
                                                    flag: str, variable: str) -> None:
    module = SERVICES[service]
    action = next(a for a in options(module.build_parser()) if flag in a.option_strings)
    raw, expected = value_from_env(action)
    assert expected != action.default
    clean_env.setenv(variable, raw)
    # Defaults are read when the parser is built, so build it after setting the variable.
    args = module.build_parser().parse_args([])
    assert getattr(args, action.dest) == expected


def test_gateway_api_keys_come_comma_separated_from_the_environment(
        clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PAGEDSERVE_GATEWAY_API_KEYS", "a, b")
    assert gateway.config.parse_config([]).api_keys == ("a", "b")
