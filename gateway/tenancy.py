"""Prefix-cache isolation between tenants: with API keys configured, each key is a tenant, and
its requests' `cache_salt` is scoped to it before the allocator sees it. A tenant can still
partition its own cache with cache_salt; it can never hit (or learn, through
`cached_tokens` or timing) blocks another key's requests computed, even by sending the same
salt. Without API keys there are no tenants and cache_salt goes through as given.

The scoped salt is a SHA-256 digest of the key's fingerprint and the salt: a fixed 64
characters, within the allocator's limit, and no key or salt appears in the allocator's views.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence


def tenant_of(authorization: str | None, api_keys: Sequence[str]) -> str:
    """The tenant of an authenticated call ("" when the gateway has no API keys)."""
    if not api_keys or not authorization:
        return ""
    return hashlib.sha256(authorization.encode()).hexdigest()[:16]


def scoped_salt(tenant: str, cache_salt: str) -> str:
    if not tenant:
        return cache_salt
    return hashlib.sha256(f"{tenant}\0{cache_salt}".encode()).hexdigest()
