"""pagedserve's domain errors as OpenAI's HTTP errors: the status code, and the body
{"error": {"message", "type", "param", "code"}} that OpenAI clients parse. The one place the
HTTP API maps errors, as pagedserve/common/error_interceptor.py is for gRPC."""
from __future__ import annotations

from pagedserve.common import errors

# (HTTP status, OpenAI error type, OpenAI error code)
HTTP_STATUS_OF: dict[type[errors.PagedServeError], tuple[int, str, str | None]] = {
    errors.InvalidArgument: (400, "invalid_request_error", None),
    errors.FailedPrecondition: (400, "invalid_request_error", None),
    errors.NotFound: (404, "invalid_request_error", "model_not_found"),
    errors.Unauthenticated: (401, "authentication_error", "invalid_api_key"),
    errors.ResourceExhausted: (429, "rate_limit_exceeded", "rate_limit_exceeded"),
    errors.Unavailable: (503, "service_unavailable", None),
}
# Anything else is a bug in pagedserve (AlreadyExists too: the gateway makes the request ids).
INTERNAL = (500, "internal_error", None)


def http_status_of(error: Exception) -> tuple[int, str, str | None]:
    """(status, type, code) of `error`; a subclass maps as its nearest mapped base."""
    for cls in type(error).__mro__:
        if cls in HTTP_STATUS_OF:
            return HTTP_STATUS_OF[cls]
    return INTERNAL


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None
               ) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
