"""Domain exceptions shared by every service, one per gRPC status code they map to.

The cores raise these (they know nothing about gRPC); the error interceptor in
`pagedserve.common.error_interceptor` turns them into status codes. The message is what a person
reads, so it says what was wrong and what to do about it.
"""
from __future__ import annotations


class PagedServeError(Exception):
    """Base of every error a caller can cause; anything else is a bug in pagedserve."""


class InvalidArgument(PagedServeError):
    """The request itself is malformed (a field out of range, missing, or inconsistent)."""


class NotFound(PagedServeError):
    """The request names something that does not exist (an executor, a sequence)."""


class AlreadyExists(PagedServeError):
    """The request would create something that exists already."""


class FailedPrecondition(PagedServeError):
    """The request is well-formed but the system is not in a state to apply it (stale epoch)."""


class ResourceExhausted(PagedServeError):
    """Overload, or a request that can never fit."""


class Unauthenticated(PagedServeError):
    """Missing or wrong credentials."""


class PermissionDenied(PagedServeError):
    """The caller is who it says, but may not do this (an executor acting for another)."""


class Unavailable(PagedServeError):
    """A dependency is down; retrying later may succeed."""
