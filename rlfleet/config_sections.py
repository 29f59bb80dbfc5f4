"""The base classes every section of the job config shares (rlfleet.config)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlfleet.addresses import check_address


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServiceEndpointConfig(Section):
    address: str | None = Field(None, description="host:port of an already running service; "
                                "when unset `rlfleet run` starts one")
    host: str = Field("127.0.0.1", description="interface to bind when serving")
    port: int = Field(0, ge=0, le=65535, description="port to bind; 0 picks a free one")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics port; 0 picks a free one")
    device: str = Field("auto", description="torch device: auto, cpu, cuda, cuda:N")

    @field_validator("address")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        return None if value is None else check_address(value)
