"""The OpenAI-compatible HTTP API: the thin layer between HTTP and the Generator that gRPC
shares.

    POST /v1/completions, /v1/chat/completions   JSON, or SSE with "stream": true
    POST /v1/responses                           OpenAI's Responses API (responses_api.py)
    GET  /v1/models, /v1/models/{id}
    POST /tokenize, /detokenize; GET /tokenizer_info   vLLM's, over the model's tokenizer
    GET  /health, GET|POST /ping                 200 while an executor is ready, else 503
    GET  /version                                {"version": ...}
    GET  /metrics                                Prometheus text format

With API keys configured, /v1/* and the tokenizer endpoints want `Authorization: Bearer KEY`;
/health, /ping, /version and /metrics stay open for orchestrators and scrapers. Every error is
OpenAI's JSON error shape. Browsers get CORS answers for the configured origins.

A request is refused with a plain HTTP error (not an event stream) when it fails before its
first event: bad fields, unknown model, admission limits. Once streaming, a failure arrives as
an `error` event followed by `[DONE]`. A client that disconnects has its generation cancelled:
while the request waits for its first event or collects a whole response, a watcher on the
ASGI disconnect message cancels it; once streaming, the failed send ends the stream. One gone
before its body arrived is no error either: nothing started, nothing is logged.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import aclosing

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.generation import GenerationEvent, Generator
from gateway.metrics import GatewayMetrics
from gateway.openai_http import tokenization
from gateway.openai_http.batch import merged
from gateway.openai_http.errors import error_body, http_status_of
from gateway.openai_http.requests import (OpenAIParamError, OpenAIRequest, expect, json_object,
                                          param_of, parse_chat_request, parse_completion_request)
from gateway.openai_http.responses import OpenAIResponder, error_of
from gateway.openai_http.responses_api import (ResponsesRequest, ResponsesResponder,
                                               parse_responses_request)
from gateway.tenancy import tenant_of
from pagedserve import __version__ as PAGEDSERVE_VERSION
from pagedserve.common.auth import bearer_refusal
from pagedserve.common.errors import (InvalidArgument, NotFound, PagedServeError, Unauthenticated,
                                      Unavailable)

log = logging.getLogger(__name__)
# A 4 Mi-character prompt (the gateway's limit) in JSON with room to spare; larger bodies are
# refused before they are read, so a huge upload cannot exhaust memory.
MAX_BODY_BYTES = 32 << 20
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class OpenAIHttpApi:
    def __init__(self, generator: Generator, metrics: GatewayMetrics,
                 api_keys: Sequence[str] = (), allowed_origins: Sequence[str] = ("*",)
                 ) -> None:
        self.generator, self.metrics, self.api_keys = generator, metrics, tuple(api_keys)
        self.app = Starlette(routes=[
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.get_model, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/tokenizer_info", self.tokenizer_info, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ping", self.health, methods=["GET", "POST"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/metrics", self.metrics_text, methods=["GET"]),
        ], exception_handlers={404: self._not_found, 405: self._not_allowed,
                               PagedServeError: self._refused},
            # vLLM's defaults: any method and header from the allowed origins, no cookies.
            middleware=[Middleware(CORSMiddleware, allow_origins=list(allowed_origins),
                                   allow_methods=["*"], allow_headers=["*"])])

    # -- endpoints -------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        return await self._generate(request, parse_completion_request)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, parse_chat_request)

    async def responses(self, request: Request) -> Response:
        return await self._generate(request, parse_responses_request)

    async def list_models(self, request: Request) -> Response:
        self._authenticate(request)
        return JSONResponse({"object": "list", "data": [
            _model_card(model) for model in sorted(self.generator.directory.models.values(),
                                                   key=lambda m: m.name)]})

    async def get_model(self, request: Request) -> Response:
        self._authenticate(request)
        model_id = request.path_params["model_id"]
        model = self.generator.directory.models.get(model_id)
        if model is None:
            raise NotFound(f"model {model_id!r} is not served here")
        return JSONResponse(_model_card(model))

    async def tokenize(self, request: Request) -> Response:
        return await self._tokenizer_call(request, tokenization.tokenize)

    async def detokenize(self, request: Request) -> Response:
        return await self._tokenizer_call(request, tokenization.detokenize)

    async def tokenizer_info(self, request: Request) -> Response:
        self._authenticate(request)
        model = self.generator.model(request.query_params.get("model", ""))
        return JSONResponse(tokenization.tokenizer_info(model))

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": PAGEDSERVE_VERSION})

    async def health(self, request: Request) -> Response:
        models = self.generator.directory.models
        if not models:
            return JSONResponse({"status": "no executor is ready"}, status_code=503)
        return JSONResponse({"status": "ok", "models": sorted(models)})

    async def metrics_text(self, request: Request) -> Response:
        # Scraping asks the allocator and executors (gateway/cluster_metrics.py): off the loop.
        text = await asyncio.to_thread(generate_latest, self.metrics.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    # -- generation ------------------------------------------------------------------------------
    async def _generate(self, request: Request, parse) -> Response:
        self._authenticate(request)   # refused by the exception handler, and not counted
        body: object = None
        try:
            body = await _read_json(request)
            parsed: OpenAIRequest = parse(body)
        except ClientDisconnect:
            # Gone before its body arrived: an ordinary client's doing, not a server error.
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as error:  # noqa: BLE001 - every refusal becomes an OpenAI error body
            # Refused before it became a generation, so `observe` never sees it: counted here.
            model = body.get("model") if isinstance(body, dict) else None
            self.metrics.count_refusal("http", error, model)
            return _error_response(error)
        tenant = tenant_of(request.headers.get("authorization"), self.api_keys)
        events = merged([self.metrics.observe(self.generator.generate(generation, tenant),
                                              "http", generation.model)
                         for generation in parsed.generations],
                        parsed.generation.sampling.n)
        try:
            first = await _unless_disconnected(request, anext(events, None))
        except ClientGone:
            await events.aclose()
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as error:  # noqa: BLE001
            await events.aclose()
            return _error_response(error)
        responder = _responder(parsed, first.model if first else parsed.generation.model)
        headers = {"x-request-id": first.request_id} if first else {}
        if parsed.stream:
            return StreamingResponse(self._sse(first, events, responder),
                                     media_type="text/event-stream",
                                     headers={**SSE_HEADERS, **headers})
        try:
            return await _unless_disconnected(
                request, self._collect(first, events, responder, headers))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        finally:
            await events.aclose()

    async def _collect(self, first: GenerationEvent | None,
                       events: AsyncIterator[GenerationEvent], responder: OpenAIResponder,
                       headers: dict[str, str]) -> Response:
        try:
            async for event in _checked(first, events):
                responder.add(event)
        except Exception as error:  # noqa: BLE001
            return _error_response(error)
        return JSONResponse(responder.response(), headers=headers)

    async def _sse(self, first: GenerationEvent | None, events, responder: OpenAIResponder
                   ) -> AsyncIterator[str]:
        # `aclosing`: also when the response is abandoned (the client is gone and the send
        # failed), the generation is closed and its executor request cancelled.
        async with aclosing(events):
            try:
                async for event in _checked(first, events):
                    for chunk in responder.chunks(event):
                        yield _sse_data(chunk)
            except Exception as error:  # noqa: BLE001 - headers are gone: report in the stream
                if not isinstance(error, PagedServeError):
                    log.error("HTTP stream failed", exc_info=error)
                _, type_, code = http_status_of(error)
                yield _sse_data(responder.error_chunk(str(error), type_, _param(error), code))
        if responder.ends_with_done:
            yield "data: [DONE]\n\n"

    async def _tokenizer_call(self, request: Request, call) -> Response:
        try:
            self._authenticate(request)
            body = json_object(await _read_json(request))
            model = self.generator.model(expect(body.get("model", ""), "model", "string"))
            # A long prompt takes milliseconds to tokenize: off the event loop.
            return JSONResponse(await asyncio.to_thread(call, body, model))
        except ClientDisconnect:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as error:  # noqa: BLE001 - every refusal becomes an OpenAI error body
            return _error_response(error)

    # -- plumbing --------------------------------------------------------------------------------
    def _authenticate(self, request: Request) -> None:
        if not self.api_keys:
            return
        reason = bearer_refusal(request.headers.get("authorization"), self.api_keys, "header")
        if reason is not None:
            raise Unauthenticated(f"{reason}; send one of the gateway's API keys "
                                  "(--api-key) as 'Authorization: Bearer KEY'")

    async def _refused(self, request: Request, exc: Exception) -> Response:
        return _error_response(exc)

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return JSONResponse(error_body(
            f"no route {request.url.path}; the API lives under /v1 (completions, "
            "chat/completions, responses, models)", "invalid_request_error"), status_code=404)

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        return JSONResponse(error_body(
            f"{request.method} is not allowed on {request.url.path}", "invalid_request_error"),
            status_code=405)


async def _read_json(request: Request) -> object:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BodyTooLarge()
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_BODY_BYTES:
            raise BodyTooLarge()
    if not body:
        raise InvalidArgument("the request body is empty; send a JSON object")
    try:
        return json.loads(body)
    except RecursionError:
        raise InvalidArgument("the request body nests too deeply to be a request") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidArgument(f"the request body is not valid JSON: {error}") from None


class BodyTooLarge(InvalidArgument):
    def __init__(self) -> None:
        super().__init__(f"the request body is over {MAX_BODY_BYTES >> 20} MiB")


# nginx's status for "the client closed the request"; nobody is there to read it.
CLIENT_CLOSED_REQUEST = 499


class ClientGone(Exception):
    """The HTTP client disconnected before its response was ready."""


async def _unless_disconnected(request: Request, work: Awaitable):
    """`work`'s result, unless the client disconnects first: then `work` is cancelled (which
    closes what it was generating) and ClientGone is raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone()
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone away (the ASGI disconnect message)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except (ClientDisconnect, OSError, RuntimeError):
        pass


async def _checked(first: GenerationEvent | None, rest: AsyncIterator[GenerationEvent]
                   ) -> AsyncIterator[GenerationEvent]:
    """`first`, then the rest; a choice that failed (its executor died) raises instead."""
    if first is None:
        return
    yield _without_failure(first)
    async for event in rest:
        yield _without_failure(event)


def _without_failure(event: GenerationEvent) -> GenerationEvent:
    failure = error_of(event)
    if failure is not None:
        raise Unavailable(f"the executor serving the request failed: {failure}")
    return event


def _param(error: Exception) -> str | None:
    if isinstance(error, OpenAIParamError):
        return error.param
    return param_of(str(error)) if isinstance(error, PagedServeError) else None


def _error_response(error: Exception) -> Response:
    if not isinstance(error, PagedServeError):
        log.error("HTTP request failed", exc_info=error)   # a bug: 500, traceback in the log
    status, type_, code = http_status_of(error)
    if isinstance(error, BodyTooLarge):
        status = 413
    return JSONResponse(error_body(str(error), type_, _param(error), code), status_code=status)


def _responder(parsed: OpenAIRequest | ResponsesRequest, model: str
               ) -> OpenAIResponder | ResponsesResponder:
    if isinstance(parsed, ResponsesRequest):
        return ResponsesResponder(parsed, f"resp_{uuid.uuid4().hex}", int(time.time()), model)
    prefix = "chatcmpl-" if parsed.chat else "cmpl-"
    return OpenAIResponder(parsed, prefix + uuid.uuid4().hex[:24], int(time.time()), model)


def _sse_data(payload: dict) -> str:
    # The Responses API's events are named by their type, as OpenAI's are; chat and completion
    # chunks have no type, and go unnamed.
    name = f"event: {payload['type']}\n" if "type" in payload else ""
    return f"{name}data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _model_card(model) -> dict:
    # root: what the model was loaded from, as vLLM reports it; here the checkpoint's name,
    # since executors on different hosts may hold it at different paths.
    return {"id": model.name, "object": "model", "created": model.created,
            "owned_by": "pagedserve", "root": model.name, "parent": None,
            "max_model_len": model.max_model_len, "num_executors": len(model.executors)}
