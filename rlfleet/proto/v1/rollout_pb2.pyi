from rlfleet.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PromptInput(_message.Message):
    __slots__ = ("request_id", "prompt_ids", "row")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    row: DataRow
    def __init__(self, request_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., row: _Optional[_Union[DataRow, _Mapping]] = ...) -> None: ...

class DataRow(_message.Message):
    __slots__ = ("data_source", "prompt", "ground_truth", "extra_info_json")
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    EXTRA_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    data_source: str
    prompt: str
    ground_truth: str
    extra_info_json: str
    def __init__(self, data_source: _Optional[str] = ..., prompt: _Optional[str] = ..., ground_truth: _Optional[str] = ..., extra_info_json: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "params", "payload_sink")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SINK_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[PromptInput]
    params: _common_pb2.SamplingParams
    payload_sink: str
    def __init__(self, prompts: _Optional[_Iterable[_Union[PromptInput, _Mapping]]] = ..., params: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., payload_sink: _Optional[str] = ...) -> None: ...

class GroupResult(_message.Message):
    __slots__ = ("request_id", "completions", "payload_address")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    completions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Completion]
    payload_address: str
    def __init__(self, request_id: _Optional[str] = ..., completions: _Optional[_Iterable[_Union[_common_pb2.Completion, _Mapping]]] = ..., payload_address: _Optional[str] = ...) -> None: ...

class JoinWeightGroupRequest(_message.Message):
    __slots__ = ("address", "rank", "world_size", "backend", "timeout_s")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    address: str
    rank: int
    world_size: int
    backend: str
    timeout_s: float
    def __init__(self, address: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class JoinWeightGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PullWeightsRequest(_message.Message):
    __slots__ = ("version", "digest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    version: int
    digest: bool
    def __init__(self, version: _Optional[int] = ..., digest: _Optional[bool] = ...) -> None: ...

class PullWeightsResponse(_message.Message):
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
