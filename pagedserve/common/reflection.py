"""gRPC server reflection, in both versions clients speak: `grpc.reflection.v1alpha` (what
grpcio-reflection serves) and `grpc.reflection.v1` (what current grpcurl, Postman and
grpcui ask first).

grpcio-reflection ships only v1alpha. The v1 protocol is the same messages, field for field,
under another package name, so the same servicer answers both: the v1 service is registered with
v1alpha's message classes (the bytes on the wire are identical), and v1's file descriptor, made
from v1alpha's by renaming the package, goes into the descriptor pool so that v1 can be described
too.

Both servicers read the descriptors through `MethodAwarePool`: grpcurl's `describe` of a method
(`pkg.Service.Method`) asks for the file containing that name, which protobuf's C descriptor
pool cannot find (it indexes services, messages and fields, not methods).
"""
from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2

V1ALPHA_SERVICE = reflection.SERVICE_NAME
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"


def enable_reflection(service_names: Iterable[str], server) -> None:
    """Serves both reflection versions on `server` (grpc.Server or grpc.aio.Server), listing
    `service_names`, the health service and reflection itself."""
    _add_v1_descriptor()
    names = [*service_names, V1_SERVICE, V1ALPHA_SERVICE]
    pool = MethodAwarePool(descriptor_pool.Default())
    reflection.enable_server_reflection(names, server, pool=pool)
    if isinstance(server, grpc.aio.Server):
        servicer = reflection.aio.ReflectionServicer(names, pool=pool)
    else:
        servicer = reflection.ReflectionServicer(names, pool=pool)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=v1alpha_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        V1_SERVICE, {"ServerReflectionInfo": handler}),))


class MethodAwarePool:
    """A descriptor pool that also finds the file of a method's full name."""

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def __getattr__(self, name: str):
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str):  # noqa: N802 - the pool's own name
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service_name, _, method = symbol.rpartition(".")
            try:
                service = self._pool.FindServiceByName(service_name)
            except KeyError:
                service = None
            if service is None or method not in service.methods_by_name:
                raise
            return service.file


def _add_v1_descriptor() -> None:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return                                   # added by an earlier server in this process
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    old = proto.package
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    proto.options.Clear()
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(f".{old}.", f".{V1_PACKAGE}.")
            method.output_type = method.output_type.replace(f".{old}.", f".{V1_PACKAGE}.")
    for message in proto.message_type:
        for field in message.field:
            if field.type_name:
                field.type_name = field.type_name.replace(f".{old}.", f".{V1_PACKAGE}.")
    pool.Add(proto)
