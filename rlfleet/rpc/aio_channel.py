"""Client side, asyncio (grpc.aio): a channel with the same TLS, token, message limits, extra options
and request ids as rlfleet.rpc.channel.open_channel's, for calls made on an event loop.

The controller streams Generate from every rollout replica on one event loop (issue 44: a thread per
replica, each polled by grpc's sync API ten times a second, did not hold at 256 replicas).

The headers (request id, step, token) go with each call as its `metadata=`, not through grpc.aio
client interceptors: an intercepted call runs its interceptor in a task of its own and wraps a
stream's messages in one more async generator, ~40 us more of the event loop's CPU a unary call of
1-32 KB (~25 % of the call; bench/aio_call_cost.py measures both ways; issue 44). AioChannel passes
them on every call made through it, so no call site can forget the token."""
from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from rlfleet.rpc.request_id import with_ids
from rlfleet.rpc.security import AUTHORIZATION, Security


class CallHeaders:
    """The metadata of one call: the request id (rlfleet.rpc.request_id: fresh unless bound in
    structlog's contextvars), the step if bound, and with a token `authorization: Bearer`, as the sync
    channel's RequestIdInterceptor and TokenClientInterceptor add them. A caller's own authorization
    header is replaced: the channel's token is the one that counts."""

    __slots__ = ("_token",)

    def __init__(self, token: str | None) -> None:
        self._token = ((AUTHORIZATION, f"Bearer {token}"),) if token else ()

    def __call__(self, metadata: Any = None) -> grpc.aio.Metadata:
        pairs = with_ids(metadata)
        if metadata:
            pairs = [(k, v) for k, v in pairs if k != AUTHORIZATION]
        return grpc.aio.Metadata(*pairs, *self._token)


class _WithHeaders:
    """A grpc.aio multicallable whose every call carries the channel's headers."""

    __slots__ = ("_call", "_headers")

    def __init__(self, call: Any, headers: CallHeaders) -> None:
        self._call = call
        self._headers = headers

    def __call__(self, request: Any, *, metadata: Any = None, **kwargs: Any) -> Any:
        return self._call(request, metadata=self._headers(metadata), **kwargs)


class AioChannel:
    """A grpc.aio channel whose calls all carry CallHeaders; the generated stubs take it as they take
    a channel. Everything else (close, get_state, wait_for_state_change, channel_ready) is the
    channel's own."""

    def __init__(self, channel: grpc.aio.Channel, headers: CallHeaders) -> None:
        self.channel = channel
        self.headers = headers

    def unary_unary(self, *args: Any, **kwargs: Any) -> _WithHeaders:
        return _WithHeaders(self.channel.unary_unary(*args, **kwargs), self.headers)

    def unary_stream(self, *args: Any, **kwargs: Any) -> _WithHeaders:
        return _WithHeaders(self.channel.unary_stream(*args, **kwargs), self.headers)

    def stream_unary(self, *args: Any, **kwargs: Any) -> _WithHeaders:
        return _WithHeaders(self.channel.stream_unary(*args, **kwargs), self.headers)

    def stream_stream(self, *args: Any, **kwargs: Any) -> _WithHeaders:
        return _WithHeaders(self.channel.stream_stream(*args, **kwargs), self.headers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.channel, name)


def open_aio_channel(address: str, security: Security | None = None,
                     extra_options: list[tuple[str, object]] | None = None) -> AioChannel:
    """An asyncio channel to `address`; call it on the event loop that will use it (grpc.aio binds a
    channel to the running loop). `extra_options`: more gRPC channel options (keepalive_options)."""
    security = security or Security()
    options = [*security.options, *(extra_options or [])]
    creds = security.channel_credentials()
    if creds is not None:
        channel = grpc.aio.secure_channel(address, creds, options=options)
    else:
        channel = grpc.aio.insecure_channel(address, options=options)
    return AioChannel(channel, CallHeaders(security.token))
