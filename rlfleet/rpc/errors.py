"""The one place where exceptions become gRPC status codes.

Servicer methods are wrapped with `@rpc_method`: it times the call on the
servicer's own `metrics`, counts in-flight work, remembers the last error for
GetStatus and maps rlfleet errors to their status code. Unexpected exceptions
become INTERNAL with the exception's message (the traceback goes to the log),
so a client never sees a raw traceback and the server keeps serving.
"""
from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

import grpc
import structlog

from rlfleet.errors import RlfleetError
from rlfleet.rpc.request_id import incoming_fields

log = structlog.get_logger(__name__)


def status_code_of(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, RlfleetError):
        return getattr(grpc.StatusCode, exc.grpc_code)
    return grpc.StatusCode.INTERNAL


class _Call:
    """Bookkeeping of one RPC on a servicer that has `role`, `metrics` and `last_error`."""

    def __init__(self, servicer: Any, method: str, context: Any = None):
        self.servicer, self.method = servicer, method
        self.metrics = getattr(servicer, "metrics", None)
        self.start = time.perf_counter()
        # Log lines written while handling the call carry its rpc, request_id and (if sent) step.
        self._log_tokens = structlog.contextvars.bind_contextvars(**incoming_fields(context, method))
        if self.metrics is not None:
            self.metrics.in_flight.labels(servicer.role).inc()

    def done(self, exc: BaseException | None) -> None:
        log.debug("rpc done", seconds=round(time.perf_counter() - self.start, 4), ok=exc is None)
        try:
            structlog.contextvars.reset_contextvars(**self._log_tokens)
        except ValueError:  # finished in another context than it started in: nothing to undo there
            pass
        if self.metrics is None:
            return
        role = self.servicer.role
        self.metrics.in_flight.labels(role).dec()
        self.metrics.rpc_latency.labels(role, self.method).observe(time.perf_counter() - self.start)
        if exc is not None:
            self.metrics.rpc_errors.labels(role, self.method, status_code_of(exc).name).inc()

    def abort(self, context: grpc.ServicerContext, exc: BaseException) -> None:
        code = status_code_of(exc)
        if isinstance(exc, RlfleetError):
            log.warning("rpc refused", method=self.method, code=code.name, error=str(exc))
        else:
            log.error("rpc failed", method=self.method, exc_info=exc)
        self.servicer.last_error = f"{self.method}: {type(exc).__name__}: {exc}"
        self.done(exc)
        context.abort(code, f"{type(exc).__name__}: {exc}")


def rpc_method(fn: Callable) -> Callable:
    """Decorates a servicer method, unary or server-streaming."""
    method = fn.__name__

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream_wrapper(self: Any, request: Any, context: grpc.ServicerContext):
            call = _Call(self, method, context)
            try:
                yield from fn(self, request, context)
            except Exception as exc:  # noqa: BLE001 - mapped to a status code
                call.abort(context, exc)
            except BaseException:  # GeneratorExit: the client cancelled or the deadline passed
                call.done(None)
                raise
            else:
                call.done(None)
        return stream_wrapper

    @functools.wraps(fn)
    def unary_wrapper(self: Any, request: Any, context: grpc.ServicerContext):
        call = _Call(self, method, context)
        try:
            response = fn(self, request, context)
        except Exception as exc:  # noqa: BLE001 - mapped to a status code
            call.abort(context, exc)
        else:
            call.done(None)
            return response
    return unary_wrapper
