from rlfleet.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceEndpoint(_message.Message):
    __slots__ = ("role", "address")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    role: str
    address: str
    def __init__(self, role: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_name", "step", "policy_version", "services", "last_metrics")
    class LastMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_FIELD_NUMBER: _ClassVar[int]
    run_name: str
    step: int
    policy_version: int
    services: _containers.RepeatedCompositeFieldContainer[ServiceEndpoint]
    last_metrics: _containers.ScalarMap[str, float]
    def __init__(self, run_name: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., services: _Optional[_Iterable[_Union[ServiceEndpoint, _Mapping]]] = ..., last_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...
