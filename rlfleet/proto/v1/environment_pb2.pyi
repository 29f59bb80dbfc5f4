from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Message(_message.Message):
    __slots__ = ("role", "content", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class EpisodeStart(_message.Message):
    __slots__ = ("episode_id", "data_source", "prompt", "ground_truth", "extra_info_json")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    EXTRA_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    data_source: str
    prompt: str
    ground_truth: str
    extra_info_json: str
    def __init__(self, episode_id: _Optional[str] = ..., data_source: _Optional[str] = ..., prompt: _Optional[str] = ..., ground_truth: _Optional[str] = ..., extra_info_json: _Optional[str] = ...) -> None: ...

class StartRequest(_message.Message):
    __slots__ = ("episodes",)
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    episodes: _containers.RepeatedCompositeFieldContainer[EpisodeStart]
    def __init__(self, episodes: _Optional[_Iterable[_Union[EpisodeStart, _Mapping]]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("name", "arguments_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments_json: str
    def __init__(self, name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("episode_id", "text", "tool_calls", "turn", "truncated")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    text: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    turn: int
    truncated: bool
    def __init__(self, episode_id: _Optional[str] = ..., text: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., turn: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("actions",)
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[Action]
    def __init__(self, actions: _Optional[_Iterable[_Union[Action, _Mapping]]] = ...) -> None: ...

class EndRequest(_message.Message):
    __slots__ = ("episode_ids", "reason")
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, episode_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("messages", "text")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    text: str
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., text: _Optional[str] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("episode_id", "ok", "error", "observation", "reward", "done", "tool_errors", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    ok: bool
    error: str
    observation: Observation
    reward: float
    done: bool
    tool_errors: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, episode_id: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., observation: _Optional[_Union[Observation, _Mapping]] = ..., reward: _Optional[float] = ..., done: _Optional[bool] = ..., tool_errors: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[StepResult]
    def __init__(self, results: _Optional[_Iterable[_Union[StepResult, _Mapping]]] = ...) -> None: ...

class ToolSpec(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("name", "description", "tools", "contract_revision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_REVISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    tools: _containers.RepeatedCompositeFieldContainer[ToolSpec]
    contract_revision: int
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[ToolSpec, _Mapping]]] = ..., contract_revision: _Optional[int] = ...) -> None: ...
