"""Environments: multi-turn episodes (tools, games) behind the rlfleet.v1.Environment contract.

The core's part: the plain types both sides speak (`types.py`), the base class an environment
is written against (`base.py`), tool-call parsing (`toolcalls.py`), an episode's per-turn token
bookkeeping (`episode.py`) and how an observation enters the conversation (`chat.py`). The
servers live in `environments/` (built-in environments and the servicer), the rollout's agent
loop in `services/rollout/`, the SDK and `rlfleet env …` in `rlfleet/app/`.
"""
from rlfleet.env.base import Environment
from rlfleet.env.types import Action, EpisodeRow, Message, Observation, StepResult, ToolCall, ToolSpec

__all__ = ["Action", "Environment", "EpisodeRow", "Message", "Observation", "StepResult", "ToolCall",
           "ToolSpec"]
