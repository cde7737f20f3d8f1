"""The thin gRPC layer of the gateway (grpc.aio, on the loop the HTTP API shares): proto in,
the Generator, proto out."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import aclosing

import grpc

from gateway.convert import event_to_proto, request_from_proto, tokenize_request_from_proto
from gateway.generation import Generator
from gateway.metrics import GatewayMetrics
from gateway.tenancy import tenant_of
from pagedserve.common.errors import Unavailable
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc


class GatewayServicer(pb_grpc.GatewayServicer):
    def __init__(self, generator: Generator, metrics: GatewayMetrics,
                 api_keys: Sequence[str] = ()) -> None:
        self.generator = generator
        self.metrics = metrics
        self.api_keys = tuple(api_keys)   # checked by the interceptor; here they name tenants

    async def Generate(self, request: pb.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> None:
        # Written with context.write rather than yielded: a client that cancels cancels this
        # task, and `aclosing` then closes the event stream here, at once, which cancels the
        # executor request (a yielding handler would be closed whenever it is collected).
        tenant = tenant_of(dict(context.invocation_metadata() or ()).get("authorization"),
                           self.api_keys)
        events = self.metrics.observe(
            self.generator.generate(request_from_proto(request), tenant), "grpc", request.model)
        failure = None
        async with aclosing(events):
            async for event in events:
                await context.write(event_to_proto(event))
                failure = failure or event.failure
        if failure is not None:
            # The failed choices' last deltas (finish reason ERROR and why) are out; the call
            # ends UNAVAILABLE as well, so a client that checks only the status cannot take a
            # cut-off answer for a whole one (an HTTP stream ends with an error event).
            raise Unavailable(f"the executor serving the request failed: {failure}")

    async def Tokenize(self, request: pb.TokenizeRequest,
                       context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        token_ids, model = await asyncio.to_thread(
            self.generator.tokenize, tokenize_request_from_proto(request))
        return pb.TokenizeResponse(token_ids=token_ids, max_model_len=model.max_model_len)

    async def ListModels(self, request: pb.ListModelsRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListModelsResponse:
        models = self.generator.directory.models
        return pb.ListModelsResponse(models=[
            pb.ModelInfo(id=model.name, max_model_len=model.max_model_len,
                         vocab_size=model.vocab_size, num_executors=len(model.executors))
            for model in sorted(models.values(), key=lambda m: m.name)])
