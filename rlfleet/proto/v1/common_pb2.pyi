from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("n", "temperature", "top_p", "top_k", "max_new_tokens", "stop", "seed")
    N_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    def __init__(self, n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("token_ids", "logprobs", "finish_reason", "policy_version", "text", "last_policy_version", "loss_mask", "turns", "env_reward", "env_failure", "env_error", "opening_tokens", "prompt_trim", "env_metrics", "response_length")
    class EnvMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LAST_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    ENV_REWARD_FIELD_NUMBER: _ClassVar[int]
    ENV_FAILURE_FIELD_NUMBER: _ClassVar[int]
    ENV_ERROR_FIELD_NUMBER: _ClassVar[int]
    OPENING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TRIM_FIELD_NUMBER: _ClassVar[int]
    ENV_METRICS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    policy_version: int
    text: str
    last_policy_version: int
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    turns: _containers.RepeatedCompositeFieldContainer[TurnRecord]
    env_reward: float
    env_failure: str
    env_error: str
    opening_tokens: int
    prompt_trim: int
    env_metrics: _containers.ScalarMap[str, float]
    response_length: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ..., policy_version: _Optional[int] = ..., text: _Optional[str] = ..., last_policy_version: _Optional[int] = ..., loss_mask: _Optional[_Iterable[int]] = ..., turns: _Optional[_Iterable[_Union[TurnRecord, _Mapping]]] = ..., env_reward: _Optional[float] = ..., env_failure: _Optional[str] = ..., env_error: _Optional[str] = ..., opening_tokens: _Optional[int] = ..., prompt_trim: _Optional[int] = ..., env_metrics: _Optional[_Mapping[str, float]] = ..., response_length: _Optional[int] = ...) -> None: ...

class TurnRecord(_message.Message):
    __slots__ = ("generated_tokens", "observed_tokens", "policy_version", "last_policy_version", "tool_calls", "tool_errors", "env_latency_s", "text", "observation", "reward", "finish_reason")
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ENV_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    generated_tokens: int
    observed_tokens: int
    policy_version: int
    last_policy_version: int
    tool_calls: int
    tool_errors: int
    env_latency_s: float
    text: str
    observation: str
    reward: float
    finish_reason: str
    def __init__(self, generated_tokens: _Optional[int] = ..., observed_tokens: _Optional[int] = ..., policy_version: _Optional[int] = ..., last_policy_version: _Optional[int] = ..., tool_calls: _Optional[int] = ..., tool_errors: _Optional[int] = ..., env_latency_s: _Optional[float] = ..., text: _Optional[str] = ..., observation: _Optional[str] = ..., reward: _Optional[float] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServiceStatus(_message.Message):
    __slots__ = ("role", "ready", "policy_version", "in_flight", "last_error", "stats", "metrics_port", "placement", "payload_sink")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SINK_FIELD_NUMBER: _ClassVar[int]
    role: str
    ready: bool
    policy_version: int
    in_flight: int
    last_error: str
    stats: _containers.ScalarMap[str, float]
    metrics_port: int
    placement: str
    payload_sink: str
    def __init__(self, role: _Optional[str] = ..., ready: _Optional[bool] = ..., policy_version: _Optional[int] = ..., in_flight: _Optional[int] = ..., last_error: _Optional[str] = ..., stats: _Optional[_Mapping[str, float]] = ..., metrics_port: _Optional[int] = ..., placement: _Optional[str] = ..., payload_sink: _Optional[str] = ...) -> None: ...
