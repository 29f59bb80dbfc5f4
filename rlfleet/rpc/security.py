"""TLS credentials and the bearer-token check for every rlfleet server and channel.

Each entry point (a service process, the controller, `rlfleet status`, `rlfleet
health`) builds one `Security.from_config(cfg.security, cfg.limits)` after loading
its config and passes it to every `ServiceServer` and `open_channel` it makes:
there is no process-wide setting. Without one they are plain gRPC.

Server side, `TokenInterceptor` refuses every RPC without `authorization: Bearer
<token>` with UNAUTHENTICATED, except `grpc.health.v1.Health` (load balancers and
container health checks carry no token; health says nothing secret). Client
side, `TokenClientInterceptor` adds the header to every call.
"""
from __future__ import annotations

import hmac
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from rlfleet.errors import ConfigError
from rlfleet.security_config import LimitsConfig, SecurityConfig

AUTHORIZATION = "authorization"
HEALTH_PREFIX = "/grpc.health.v1.Health/"


@dataclass(frozen=True)
class Security:
    """What one process uses: TLS material (bytes) read once, and the token."""

    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None
    require_client_cert: bool = False
    server_name: str | None = None
    token: str | None = None
    max_message_bytes: int = 512 * 1024 * 1024
    max_health_watches: int = 4

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @classmethod
    def from_config(cls, cfg: SecurityConfig | None, limits: LimitsConfig | None = None) -> Security:
        cfg = cfg or SecurityConfig()
        limits = limits or LimitsConfig()
        check_tls_files(cfg)
        return cls(cert=_read(cfg.tls_cert, "tls_cert"), key=_read(cfg.tls_key, "tls_key"),
                   ca=_read(cfg.tls_ca, "tls_ca"), require_client_cert=cfg.require_client_cert,
                   server_name=cfg.server_name, token=cfg.read_token(),
                   max_message_bytes=limits.max_message_mb * 1024 * 1024,
                   max_health_watches=limits.max_health_watches)

    # ---- gRPC pieces ----------------------------------------------------------------------------

    @property
    def options(self) -> list[tuple[str, object]]:
        opts: list[tuple[str, object]] = [("grpc.max_send_message_length", self.max_message_bytes),
                                          ("grpc.max_receive_message_length", self.max_message_bytes)]
        if self.tls and self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        return opts

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=self.require_client_cert)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not self.tls and self.ca is None:
            return None
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def server_interceptors(self, on_refused: Callable[[str, str], None] | None = None
                            ) -> list[grpc.ServerInterceptor]:
        """`on_refused(method, reason)` hears of every call refused for its token."""
        return [TokenInterceptor(self.token, on_refused)] if self.token else []

    def client_interceptors(self) -> list[grpc.UnaryUnaryClientInterceptor]:
        return [TokenClientInterceptor(self.token)] if self.token else []


def check_tls_files(cfg: SecurityConfig) -> None:
    """Parses the PEM files with the stdlib's OpenSSL, so a bad file is named here rather than
    surfacing later as grpc's "Failed to bind to address" (a server) or a failed handshake."""
    for key in ("tls_cert", "tls_key", "tls_ca"):
        path = getattr(cfg, key)
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"security.{key} {path}: cannot read: no such file")
    if cfg.tls_ca is not None:
        try:
            ssl.create_default_context(cafile=cfg.tls_ca)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"security.tls_ca {cfg.tls_ca}: not a PEM CA certificate ({exc})") from None
    if cfg.tls_cert is None or cfg.tls_key is None:
        return
    try:  # the certificate alone first: a failure of the pair after that is the key's
        ssl.create_default_context(cafile=cfg.tls_cert)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"security.tls_cert {cfg.tls_cert}: not a PEM certificate ({exc})") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cfg.tls_cert, cfg.tls_key)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"security.tls_key {cfg.tls_key}: not a PEM private key matching security.tls_cert "
                          f"{cfg.tls_cert} ({exc})") from None


def _read(path: str | None, key: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"security.{key} {path}: cannot read: {exc}") from None


def token_digest(token: str, message: str) -> str:
    """HMAC-SHA256 of `message` under `token` (hex), e.g. for the weight-group rendezvous."""
    return hmac.new(token.encode(), message.encode(), "sha256").hexdigest()


# ---- the token check ------------------------------------------------------------------------------

def _refuse(details: str):
    def deny(_request, context: grpc.ServicerContext):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, details)
    return deny


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses any RPC but health without the bearer token, before the request is handled."""

    def __init__(self, token: str, on_refused: Callable[[str, str], None] | None = None):
        self._expected = f"Bearer {token}".encode()
        self._on_refused = on_refused

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method or ""
        if method.startswith(HEALTH_PREFIX):
            return continuation(handler_call_details)
        sent = next((v for k, v in (handler_call_details.invocation_metadata or ()) if k
                     == AUTHORIZATION), None)
        if sent is not None and hmac.compare_digest(sent.encode() if isinstance(sent, str) else sent,
                                                    self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        details = "missing bearer token" if sent is None else "invalid bearer token"
        if self._on_refused is not None:
            self._on_refused(method, details)
        deny = _refuse(details)
        # The caller's request is never *read*, let alone parsed: a handler that takes a request
        # stream and never iterates it answers from the headers alone. (A unary handler would
        # first receive the whole message, up to max_message_mb, before it could refuse it.)
        # Unknown methods get the same answer, so a caller without the token learns nothing.
        if handler is not None and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(lambda _requests, ctx: deny(None, ctx), None,
                                                         handler.response_serializer)
        return grpc.stream_unary_rpc_method_handler(lambda _requests, ctx: deny(None, ctx), None,
                                                    handler.response_serializer if handler else None)


class TokenClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call (works on plain and TLS channels)."""

    def __init__(self, token: str):
        self._header = (AUTHORIZATION, f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        from rlfleet.rpc.request_id import _CallDetails

        metadata = [(k, v) for k, v in (details.metadata or []) if k != AUTHORIZATION]
        metadata.append(self._header)
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def secure_channel(address: str, security: Security | None = None,
                   extra_options: list[tuple[str, object]] | None = None) -> grpc.Channel:
    """A channel with `security`'s TLS, token and message limit (None: plain gRPC); no other interceptor."""
    security = security or Security()
    options = [*security.options, *(extra_options or [])]
    creds = security.channel_credentials()
    channel = grpc.secure_channel(address, creds, options=options) if creds else \
        grpc.insecure_channel(address, options=options)
    interceptors = security.client_interceptors()
    return grpc.intercept_channel(channel, *interceptors) if interceptors else channel
