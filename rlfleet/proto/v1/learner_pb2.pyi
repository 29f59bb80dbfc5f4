from rlfleet.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrainSample(_message.Message):
    __slots__ = ("prompt_ids", "response_ids", "behaviour_logprobs", "advantage", "generation_version", "reward", "loss_mask", "payload")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_IDS_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    response_ids: _containers.RepeatedScalarFieldContainer[int]
    behaviour_logprobs: _containers.RepeatedScalarFieldContainer[float]
    advantage: float
    generation_version: int
    reward: float
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    payload: PayloadRef
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., response_ids: _Optional[_Iterable[int]] = ..., behaviour_logprobs: _Optional[_Iterable[float]] = ..., advantage: _Optional[float] = ..., generation_version: _Optional[int] = ..., reward: _Optional[float] = ..., loss_mask: _Optional[_Iterable[int]] = ..., payload: _Optional[_Union[PayloadRef, _Mapping]] = ...) -> None: ...

class PayloadRef(_message.Message):
    __slots__ = ("address", "request_id", "sample")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    address: str
    request_id: str
    sample: int
    def __init__(self, address: _Optional[str] = ..., request_id: _Optional[str] = ..., sample: _Optional[int] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("step", "samples", "temperature", "expected_version")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    step: int
    samples: _containers.RepeatedCompositeFieldContainer[TrainSample]
    temperature: float
    expected_version: int
    def __init__(self, step: _Optional[int] = ..., samples: _Optional[_Iterable[_Union[TrainSample, _Mapping]]] = ..., temperature: _Optional[float] = ..., expected_version: _Optional[int] = ...) -> None: ...

class TrainResponse(_message.Message):
    __slots__ = ("policy_version", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, policy_version: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class OpenWeightGroupRequest(_message.Message):
    __slots__ = ("world_size", "timeout_s", "member_placements")
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MEMBER_PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    world_size: int
    timeout_s: float
    member_placements: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, world_size: _Optional[int] = ..., timeout_s: _Optional[float] = ..., member_placements: _Optional[_Iterable[str]] = ...) -> None: ...

class OpenWeightGroupResponse(_message.Message):
    __slots__ = ("address", "backend")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    address: str
    backend: str
    def __init__(self, address: _Optional[str] = ..., backend: _Optional[str] = ...) -> None: ...

class PushWeightsRequest(_message.Message):
    __slots__ = ("version", "digest", "group")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    version: int
    digest: bool
    group: str
    def __init__(self, version: _Optional[int] = ..., digest: _Optional[bool] = ..., group: _Optional[str] = ...) -> None: ...

class PushWeightsResponse(_message.Message):
    __slots__ = ("version", "bytes", "seconds", "digest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    version: int
    bytes: int
    seconds: float
    digest: str
    def __init__(self, version: _Optional[int] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., digest: _Optional[str] = ...) -> None: ...

class AbortWeightGroupRequest(_message.Message):
    __slots__ = ("group", "reason")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    group: str
    reason: str
    def __init__(self, group: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortWeightGroupResponse(_message.Message):
    __slots__ = ("pushing",)
    PUSHING_FIELD_NUMBER: _ClassVar[int]
    pushing: bool
    def __init__(self, pushing: _Optional[bool] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ("step", "path")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    step: int
    path: str
    def __init__(self, step: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints", "restored_from")
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    restored_from: CheckpointInfo
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ..., restored_from: _Optional[_Union[CheckpointInfo, _Mapping]] = ...) -> None: ...
