"""Requests that do not parse get INVALID_ARGUMENT, not gRPC's generic INTERNAL.

gRPC Python answers a request its deserializer cannot parse with INTERNAL
("Exception deserializing request!"), which reads like a server bug. This
interceptor parses unary requests itself and answers INVALID_ARGUMENT naming the
method, so a client that sent garbage is told so. The server keeps serving either way.
"""
from __future__ import annotations

from collections.abc import Callable

import grpc


def _parsing(deserializer: Callable[[bytes], object] | None, behavior: Callable, method: str) -> Callable:
    def handle(raw: bytes, context: grpc.ServicerContext):
        try:
            request = deserializer(raw) if deserializer is not None else raw
        except Exception as exc:  # noqa: BLE001 - DecodeError, or anything else a parser raises
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"malformed {method} request ({len(raw)} bytes): {type(exc).__name__}")
        return behavior(request, context)
    return handle


class MalformedRequestInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        method = (handler_call_details.method or "").rsplit("/", 1)[-1]
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                _parsing(handler.request_deserializer, handler.unary_stream, method), None,
                handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(
            _parsing(handler.request_deserializer, handler.unary_unary, method), None,
            handler.response_serializer)
