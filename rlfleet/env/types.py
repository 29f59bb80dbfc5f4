"""Plain values of the environment contract (twins of environment.proto's messages)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: causes an episode can fail with (Completion.env_failure, `env/failed/<cause>` metrics)
UNAVAILABLE, TIMEOUT, INVALID_REPLY, EPISODE_ERROR, RPC_ERROR = (
    "unavailable", "timeout", "invalid_reply", "episode_error", "rpc_error")
FAILURE_CAUSES = (UNAVAILABLE, TIMEOUT, INVALID_REPLY, EPISODE_ERROR, RPC_ERROR)
#: causes whose call failed as a whole: the server may still hold the episode (it gets End(failed))
CALL_FAILURES = (UNAVAILABLE, TIMEOUT, INVALID_REPLY, RPC_ERROR)

#: End's reasons (EndRequest.reason, environment.proto): rollout.max_turns reached; the token budget
#: (rollout.max_episode_tokens, the context) has no room for another turn; a call for the episode
#: failed (best effort); the rollout gave the episode up (a failed generation, a cancelled request)
END_MAX_TURNS, END_LENGTH, END_FAILED, END_ABORTED = "max_turns", "length", "failed", "aborted"
END_REASONS = (END_MAX_TURNS, END_LENGTH, END_FAILED, END_ABORTED)


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    name: str = ""


@dataclass(frozen=True)
class Observation:
    """What the model sees next: chat messages (through the chat template) or raw text."""

    messages: tuple[Message, ...] = ()
    text: str = ""

    @property
    def empty(self) -> bool:
        return not self.messages and not self.text

    @classmethod
    def of(cls, value: Observation | str | Message | list | tuple | None) -> Observation:
        """An Observation from what an environment returns: an Observation, one Message, a list of
        Messages (or {role, content} dicts), None, or a string, which becomes one user message."""
        if value is None:
            return cls()
        if isinstance(value, Observation):
            return value
        if isinstance(value, str):
            return cls(messages=(Message("user", value),))
        if isinstance(value, Message):
            return cls(messages=(value,))
        if isinstance(value, (list, tuple)):
            return cls(messages=tuple(m if isinstance(m, Message) else Message(**m) for m in value))
        raise TypeError(f"an observation must be a str, Message, list of messages or Observation, "
                        f"not {type(value).__name__}")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Any  # a dict for JSON calls, a string for tagged ones


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)  # a JSON schema


@dataclass(frozen=True)
class EpisodeRow:
    """The data row an episode starts from."""

    episode_id: str
    data_source: str = ""
    prompt: str = ""
    ground_truth: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    """The model's turn."""

    episode_id: str
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    turn: int = 1
    truncated: bool = False


@dataclass(frozen=True)
class StepResult:
    """An environment's answer to Start, Step or End for one episode."""

    episode_id: str = ""
    observation: Observation = field(default_factory=Observation)
    reward: float | None = None
    done: bool = False
    tool_errors: int = 0
    ok: bool = True
    error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    failure: str = ""  # set by the rollout's client when the episode failed: one of FAILURE_CAUSES
