"""docker-compose.yml as the services see it: parsed (YAML merge keys included) with `${VAR:-x}`
interpolated from a given environment, as docker compose would; optionally with
docker-compose.shards.yml laid over it, as `docker compose -f A -f B` merges them."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
SHARDS_FILE = COMPOSE_FILE.with_name("docker-compose.shards.yml")
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    return value


def load_compose(env: dict[str, str] | None = None, shards: bool = False) -> dict[str, Any]:
    """The compose file; with `shards`, the allocator-group file merged over it."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    if shards:
        compose = merged(compose, yaml.safe_load(SHARDS_FILE.read_text()))
    return interpolate(compose, env or {})


def merged(base: Any, override: Any) -> Any:
    """Compose's rule for the mappings our files override (services, environment,
    depends_on): keys merge recursively; any other value is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        result = dict(base)
        for key, value in override.items():
            result[key] = merged(base[key], value) if key in base else value
        return result
    return override


def active_services(compose: dict[str, Any], profile: str) -> dict[str, dict[str, Any]]:
    """The services `COMPOSE_PROFILES=profile docker compose up` starts."""
    return {name: service for name, service in compose["services"].items()
            if not service.get("profiles") or profile in service["profiles"]}


def flag_value(command: list[str], flag: str) -> str | None:
    """The value of `flag` in a command line (the last one, as argparse reads it)."""
    values = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == flag]
    return values[-1] if values else None
