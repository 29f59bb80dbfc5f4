"""Caps the open `grpc.health.v1.Health/Watch` streams of one server.

Health needs no token (load balancers carry none), and each Watch stream holds a
thread of the server's pool for as long as the client keeps it open. Without a cap,
a peer without the token could open as many streams as the pool has threads and
starve every authenticated call (and Health/Check). `ServiceServer` gives the pool
`limit` threads on top of its workers, so the watches it admits never take a worker's
thread, and refuses any stream beyond `limit` at once with RESOURCE_EXHAUSTED.
"""
from __future__ import annotations

import threading

import grpc

WATCH_METHOD = "/grpc.health.v1.Health/Watch"


class WatchLimit(grpc.ServerInterceptor):
    def __init__(self, limit: int):
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler_call_details.method != WATCH_METHOD or handler is None or not handler.response_streaming:
            return handler
        watch = handler.unary_stream
        slots, limit = self._slots, self.limit

        def limited(request, context):
            if not slots.acquire(blocking=False):
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"this server already serves {limit} health Watch streams; use Health/Check")
            try:
                yield from watch(request, context)
            finally:
                slots.release()

        return grpc.unary_stream_rpc_method_handler(limited, handler.request_deserializer,
                                                    handler.response_serializer)
