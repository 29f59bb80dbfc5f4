"""What an environment implements: a few methods over the episode's own state.

    class Guess(Environment):
        name = "guess"

        def start(self, row):                      # -> the episode's state, any object
            return {"answer": row.ground_truth, "tries": 0}

        def step(self, state, action):             # -> Step (observation, reward, done)
            state["tries"] += 1
            if action.text.strip() == state["answer"]:
                return Step(reward=1.0, done=True)
            return Step(observation="Wrong, try again.", done=state["tries"] >= 3, reward=0.0)

The server (environments/servicer.py) keeps the states by episode id, answers the batched
contract and turns exceptions into per-episode errors; nothing here knows gRPC.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from rlfleet.env.types import Action, EpisodeRow, Observation, StepResult, ToolSpec

Step = StepResult  # what `step` returns, spelled for environment authors


class Environment(ABC):
    name: str = "environment"
    description: str = ""
    tools: tuple[ToolSpec, ...] = ()

    @abstractmethod
    def start(self, row: EpisodeRow) -> Any:
        """Starts an episode from a data row; returns its state (kept by the server)."""

    def opening(self, state: Any) -> Observation | str | None:
        """An observation shown before the model's first turn (none by default)."""
        return None

    @abstractmethod
    def step(self, state: Any, action: Action) -> StepResult:
        """Answers the model's turn: the next observation, a reward when due, done."""

    def end(self, state: Any, reason: str) -> float | None:
        """The reward of an episode the rollout stopped before done (None: no reward)."""
        return None

    def close(self) -> None:
        """Releases what the environment holds (called when its server stops)."""
