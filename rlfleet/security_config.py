"""Config of transport security (`security`) and request limits (`limits`).

`security`: TLS on every gRPC server and channel when `tls_cert`/`tls_key` are set,
mutual TLS when `require_client_cert` is also set, and a bearer token on every RPC
except the health service when `token` or `token_file` is set. The same token
admits ranks into the weight-broadcast group (rlfleet.weights.group). Everything
off (the default) is plain gRPC on 127.0.0.1, fine for one machine; see
docs/security.md before binding other interfaces.

`limits`: what one request may ask of a service; larger requests get
RESOURCE_EXHAUSTED, and the service keeps serving.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlfleet.errors import ConfigError


class SecurityConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    tls_cert: str | None = Field(None, description="PEM certificate (chain) this process presents, as server "
                                 "and, with mutual TLS, as client; enables TLS on every server and channel")
    tls_key: str | None = Field(None, description="PEM private key of tls_cert")
    tls_ca: str | None = Field(None, description="PEM CA bundle that verifies peers (servers, and "
                               "clients when require_client_cert); null: the system's roots")
    require_client_cert: bool = Field(False, description="mutual TLS: servers refuse clients without a "
                                      "certificate signed by tls_ca")
    server_name: str | None = Field(None, description="name checked against the server certificate "
                                    "instead of the host of the address (when the certificate names a "
                                    "DNS name)")
    token: str | None = Field(None, min_length=16, description="bearer token every RPC must carry "
                              "(authorization: Bearer ...); prefer token_file")
    token_file: str | None = Field(None, description="file holding the bearer token (first line)")

    @model_validator(mode="after")
    def _check(self) -> SecurityConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("security.tls_cert and security.tls_key must be set together")
        if self.require_client_cert and (self.tls_cert is None or self.tls_ca is None):
            raise ValueError("security.require_client_cert needs security.tls_cert, tls_key and tls_ca")
        if self.token is not None and self.token_file is not None:
            raise ValueError("set one of security.token and security.token_file, not both")
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def read_token(self) -> str | None:
        """The bearer token, or None when none is configured."""
        if self.token_file is None:
            return self.token
        path = Path(self.token_file)
        try:
            lines = path.read_text().strip().splitlines()
        except OSError as exc:
            raise ConfigError(f"security.token_file {path}: cannot read: {exc}") from None
        token = lines[0].strip() if lines else ""
        if len(token) < 16:
            raise ConfigError(f"security.token_file {path}: the token must be at least 16 characters")
        return token


class LimitsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    max_message_mb: int = Field(512, ge=1, le=2047, description="largest gRPC message a server or channel "
                                "accepts; larger ones get RESOURCE_EXHAUSTED")
    max_prompts_per_request: int = Field(4096, ge=1, description="prompts in one Generate call")
    max_samples_per_prompt: int = Field(1024, ge=1, description="n of one Generate call")
    max_sequences_per_request: int = Field(65536, ge=1, description="prompts x n of one Generate call")
    max_train_samples: int = Field(65536, ge=1, description="samples in one Train call")
    max_score_items: int = Field(65536, ge=1, description="items in one Score call")
    max_text_chars: int = Field(1 << 20, ge=1, description="characters of one prompt/response/ground truth/"
                                "extra_info in a Score item")
    max_weight_timeout_s: float = Field(600.0, gt=0.0, description="largest timeout_s a weight-group RPC "
                                        "may ask for (a pending join or push holds a server thread "
                                        "that long)")
    max_world_size: int = Field(1024, ge=2, description="largest weight-group world size")
    max_health_watches: int = Field(4, ge=1, le=64, description="open health Watch streams one server serves "
                                    "(health needs no token); more are refused with RESOURCE_EXHAUSTED")
