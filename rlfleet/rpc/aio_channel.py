"""Client side, asyncio (grpc.aio): a channel with the same TLS, token, message limits, extra options
and request ids as rlfleet.rpc.channel.open_channel's, for calls made on an event loop.

The controller streams Generate from every rollout replica on one event loop (issue 44: a thread per
replica, each polled by grpc's sync API ten times a second, did not hold at 256 replicas)."""
from __future__ import annotations

import grpc
import grpc.aio

from rlfleet.rpc.request_id import with_ids
from rlfleet.rpc.security import AUTHORIZATION, Security


class _Metadata:
    """Adds the request id (rlfleet.rpc.request_id) and, with a token, `authorization: Bearer` to every
    call, as the sync channel's RequestIdInterceptor and TokenClientInterceptor do."""

    def __init__(self, token: str | None) -> None:
        self._header = (AUTHORIZATION, f"Bearer {token}") if token else None

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = [(k, v) for k, v in with_ids(details.metadata) if k != AUTHORIZATION]
        if self._header is not None:
            metadata.append(self._header)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, grpc.aio.Metadata(*metadata),
                                          details.credentials, details.wait_for_ready)


# One object per kind of call: grpc.aio files an interceptor under the first kind it is an instance of.
class _UnaryStreamMetadata(_Metadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _UnaryUnaryMetadata(_Metadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


def open_aio_channel(address: str, security: Security | None = None,
                     extra_options: list[tuple[str, object]] | None = None) -> grpc.aio.Channel:
    """An asyncio channel to `address`; call it on the event loop that will use it (grpc.aio binds a
    channel to the running loop). `extra_options`: more gRPC channel options (keepalive_options)."""
    security = security or Security()
    options = [*security.options, *(extra_options or [])]
    creds = security.channel_credentials()
    interceptors = [_UnaryStreamMetadata(security.token), _UnaryUnaryMetadata(security.token)]
    if creds is not None:
        return grpc.aio.secure_channel(address, creds, options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
