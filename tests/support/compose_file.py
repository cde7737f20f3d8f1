"""docker-compose.yml as the services see it: parsed (YAML merge keys included) with `${VAR:-x}`
interpolated from a given environment, as docker compose would."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    return value


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    return interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), env or {})


def active_services(compose: dict[str, Any], profile: str) -> dict[str, dict[str, Any]]:
    """The services `COMPOSE_PROFILES=profile docker compose up` starts."""
    return {name: service for name, service in compose["services"].items()
            if not service.get("profiles") or profile in service["profiles"]}


def flag_value(command: list[str], flag: str) -> str | None:
    """The value of `flag` in a command line (the last one, as argparse reads it)."""
    values = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == flag]
    return values[-1] if values else None
