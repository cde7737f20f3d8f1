"""The thin gRPC layer of the gateway: proto in, the Generator, proto out."""
from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc

from gateway.convert import event_to_proto, request_from_proto, tokenize_request_from_proto
from gateway.generation import Generator
from gateway.metrics import GatewayMetrics
from pagedserve.gateway.v1 import gateway_pb2 as pb
from pagedserve.gateway.v1 import gateway_pb2_grpc as pb_grpc


class GatewayServicer(pb_grpc.GatewayServicer):
    def __init__(self, generator: Generator, metrics: GatewayMetrics) -> None:
        self.generator = generator
        self.metrics = metrics

    def Generate(self, request: pb.GenerateRequest,
                 context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        gone = threading.Event()
        # Fires when the client cancels or disconnects: the generator polls it and cancels
        # the executor request.
        context.add_callback(gone.set)
        events = self.metrics.observe(
            self.generator.generate(request_from_proto(request), gone.is_set), "grpc")
        try:
            for event in events:
                yield event_to_proto(event)
        finally:
            events.close()   # a cancelled call stops iterating us; this cancels the request

    def Tokenize(self, request: pb.TokenizeRequest,
                 context: grpc.ServicerContext) -> pb.TokenizeResponse:
        token_ids, model = self.generator.tokenize(tokenize_request_from_proto(request))
        return pb.TokenizeResponse(token_ids=token_ids, max_model_len=model.max_model_len)

    def ListModels(self, request: pb.ListModelsRequest,
                   context: grpc.ServicerContext) -> pb.ListModelsResponse:
        models = self.generator.directory.models
        return pb.ListModelsResponse(models=[
            pb.ModelInfo(id=model.name, max_model_len=model.max_model_len,
                         vocab_size=model.vocab_size, num_executors=len(model.executors))
            for model in sorted(models.values(), key=lambda m: m.name)])
