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

class FleetMember(_message.Message):
    __slots__ = ("name", "address", "state", "joined", "groups", "since")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    state: str
    joined: bool
    groups: int
    since: float
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[str] = ..., joined: _Optional[bool] = ..., groups: _Optional[int] = ..., since: _Optional[float] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_name", "step", "policy_version", "services", "last_metrics", "fleet", "environments")
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
    FLEET_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    run_name: str
    step: int
    policy_version: int
    services: _containers.RepeatedCompositeFieldContainer[ServiceEndpoint]
    last_metrics: _containers.ScalarMap[str, float]
    fleet: _containers.RepeatedCompositeFieldContainer[FleetMember]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentStatus]
    def __init__(self, run_name: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., services: _Optional[_Iterable[_Union[ServiceEndpoint, _Mapping]]] = ..., last_metrics: _Optional[_Mapping[str, float]] = ..., fleet: _Optional[_Iterable[_Union[FleetMember, _Mapping]]] = ..., environments: _Optional[_Iterable[_Union[EnvironmentStatus, _Mapping]]] = ...) -> None: ...

class EnvironmentStatus(_message.Message):
    __slots__ = ("address", "episodes", "failed", "last_error", "outage", "outage_s")
    class FailedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    OUTAGE_FIELD_NUMBER: _ClassVar[int]
    OUTAGE_S_FIELD_NUMBER: _ClassVar[int]
    address: str
    episodes: int
    failed: _containers.ScalarMap[str, int]
    last_error: str
    outage: str
    outage_s: float
    def __init__(self, address: _Optional[str] = ..., episodes: _Optional[int] = ..., failed: _Optional[_Mapping[str, int]] = ..., last_error: _Optional[str] = ..., outage: _Optional[str] = ..., outage_s: _Optional[float] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("address", "name", "model_identity", "model_summary", "model_architecture")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    MODEL_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    MODEL_ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    address: str
    name: str
    model_identity: str
    model_summary: str
    model_architecture: str
    def __init__(self, address: _Optional[str] = ..., name: _Optional[str] = ..., model_identity: _Optional[str] = ..., model_summary: _Optional[str] = ..., model_architecture: _Optional[str] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("run_name", "name", "policy_version")
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    run_name: str
    name: str
    policy_version: int
    def __init__(self, run_name: _Optional[str] = ..., name: _Optional[str] = ..., policy_version: _Optional[int] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("address", "timeout_s", "reason")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    address: str
    timeout_s: float
    reason: str
    def __init__(self, address: _Optional[str] = ..., timeout_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ("finished", "handed_back")
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    HANDED_BACK_FIELD_NUMBER: _ClassVar[int]
    finished: int
    handed_back: int
    def __init__(self, finished: _Optional[int] = ..., handed_back: _Optional[int] = ...) -> None: ...
