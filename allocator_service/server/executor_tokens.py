"""Per-executor tokens: which executor a bearer token belongs to.

With one shared token, any holder of it (every executor, the gateway) can act for any executor:
a Step names its executor id and epoch, and epochs are visible in the admin views. An
operator who gives each executor its own token (`--executor-tokens FILE`) binds every
RegisterExecutor, Heartbeat and Step to the executor the token names, so one executor can
neither reset, renew nor step another's pool (allocator_service/server/executor_identity.py enforces
it).

The file holds one `EXECUTOR_ID TOKEN` pair per line; blank lines and lines starting with `#`
are ignored. Pure Python: no gRPC.
"""
from __future__ import annotations

import hmac
from collections.abc import Mapping
from pathlib import Path

MIN_TOKEN_CHARS = 16


class ExecutorTokens:
    def __init__(self, tokens: Mapping[str, str]) -> None:
        """`tokens`: executor id → that executor's token."""
        self._tokens = dict(tokens)

    @property
    def executor_ids(self) -> list[str]:
        return sorted(self._tokens)

    @property
    def tokens(self) -> list[str]:
        return list(self._tokens.values())

    def owner(self, authorization: str | None) -> str | None:
        """The executor whose token this `authorization` value carries, else None. Compares
        with every token in constant time, so timing does not tell which one nearly matched."""
        if authorization is None:
            return None
        found = None
        for executor_id, token in self._tokens.items():
            if hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
                found = executor_id
        return found


def parse_executor_tokens(text: str, where: str, shared_token: str) -> ExecutorTokens:
    """Reads the `EXECUTOR_ID TOKEN` lines; a malformed file raises ValueError naming the line
    (`where` says which file). A token must be unique, and must not be the shared token: a
    token has to say who is calling."""
    tokens: dict[str, str] = {}
    owners: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        at = f"{where}:{number}"
        if len(fields) != 2:
            raise ValueError(f"{at}: expected 'EXECUTOR_ID TOKEN', got {len(fields)} fields")
        executor_id, token = fields
        if executor_id in tokens:
            raise ValueError(f"{at}: executor {executor_id!r} is listed twice")
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(f"{at}: the token of executor {executor_id!r} is shorter than "
                             f"{MIN_TOKEN_CHARS} characters; use a random one "
                             "(e.g. `openssl rand -hex 16`)")
        if token in owners:
            raise ValueError(f"{at}: executor {executor_id!r} has the same token as "
                             f"{owners[token]!r}; each executor needs its own")
        if token == shared_token:
            raise ValueError(f"{at}: the token of executor {executor_id!r} is the shared "
                             "--auth-token; each executor needs its own")
        tokens[executor_id], owners[token] = token, executor_id
    if not tokens:
        raise ValueError(f"{where}: no 'EXECUTOR_ID TOKEN' line")
    return ExecutorTokens(tokens)


def load_executor_tokens(path: str, shared_token: str) -> ExecutorTokens:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"cannot read --executor-tokens {path}: {error.strerror}") from None
    return parse_executor_tokens(text, path, shared_token)
