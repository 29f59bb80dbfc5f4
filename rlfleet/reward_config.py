"""Config of reward sources and of the reward model (the `reward.sources` and `reward.model` keys).

Every sample is scored by the reward service that `rlfleet run` starts (or
`reward.address`). With no `reward.sources` it scores with `reward.fn`, or
`reward.model` when its path is set. With `reward.sources`, the reward service
scores every sample with each source (services/reward/sources/) and the controller
trains on the weighted sum; a sample that any source could not score is left out
of training and counted, never scored 0.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlfleet.addresses import check_address

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RewardModelConfig(_Section):
    path: str | None = Field(None, description="HF sequence-classification model folder (num_labels=1); "
                             "when set the reward service scores with it instead of reward.fn")
    device: str = Field("auto", description="torch device of the reward model: auto, cpu, cuda, cuda:N; "
                        "auto takes the third GPU when there are several (rollout 0, learner 1)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="weights' dtype; "
                                                                     "auto: bfloat16 on a GPU, else float32")
    batch_size: int = Field(16, ge=1, description="sequences per forward pass")
    max_length: int = Field(2048, ge=8, description="tokens of prompt + response; longer inputs "
                            "lose the start of the prompt, never the response")


class RewardSourceConfig(_Section):
    """One reward source; exactly one of `address`, `function`, `service`."""

    name: str = Field(min_length=1, max_length=64, description="names its metrics: reward/<name>/mean …")
    address: str | None = Field(None, description="host:port of an external gRPC reward server "
                                "implementing rlfleet.v1.Reward")
    function: str | None = Field(None, description="a built-in reward (auto, gsm8k, math, exact_match, "
                                 "regex_match, format, length_penalty, code, digits, reasoning_gym) or "
                                 "pkg.module:function, run inside the reward service")
    service: bool = Field(False, description="the reward service's own scorer (reward.model, else "
                          "reward.fn): the way to use them as one of several sources")
    fleet_security: bool = Field(True, description="an address source: connect with the `security` section's "
                                 "TLS and bearer token; false: plain gRPC without the token, for a server "
                                 "outside the fleet's trust (docs/security.md)")
    weight: float = Field(1.0, ge=-1e6, le=1e6, description="the sample's reward is the weighted sum")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of a function "
                                   "source, e.g. {max_length: 200} for length_penalty")
    timeout_s: float = Field(30.0, gt=0.0, description="deadline of one call (one batch) to this source")
    batch_size: int = Field(64, ge=1, description="items per Score call")
    max_concurrency: int = Field(4, ge=1, description="calls in flight to this source at once")
    max_retries: int = Field(3, ge=0, description="retries of a call that failed transiently "
                             "(UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED)")
    backoff_s: float = Field(0.5, ge=0.0, description="first retry delay; doubles per retry, with jitter")
    backoff_max_s: float = Field(10.0, ge=0.0, description="longest retry delay")
    circuit_failures: int = Field(5, ge=1, description="consecutive failed calls that open the circuit")
    circuit_cooldown_s: float = Field(30.0, gt=0.0, description="how long an open circuit fails calls at "
                                      "once before one probe call is let through")

    @field_validator("address")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        return None if value is None else check_address(value)

    @model_validator(mode="after")
    def _one_kind(self) -> RewardSourceConfig:
        if not _NAME.match(self.name):
            raise ValueError(f"reward source name {self.name!r} may hold only letters, digits, _ . -")
        kinds = [k for k, v in (("address", self.address), ("function", self.function),
                                ("service", self.service)) if v]
        if len(kinds) != 1:
            raise ValueError(f"reward source {self.name!r} needs exactly one of address, function, "
                             f"service: true (got {', '.join(kinds) or 'none'})")
        if self.params and not self.function:
            raise ValueError(f"reward source {self.name!r}: params apply only to a function source")
        return self


def check_sources(sources: list[RewardSourceConfig]) -> None:
    names = [s.name for s in sources]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"reward.sources: duplicate names {duplicates}")
