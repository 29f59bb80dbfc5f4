"""`digits_game`: reverse a digit string in up to `max_tries` attempts (2 by default); the embedded tiny
model's multi-turn task (its data set is the built-in digits_reverse task: `rlfleet data digits-reverse`).

Each attempt is one turn. A right answer ends the episode; a wrong one is answered with the same
request again ("Reverse the digits: 4721", which the tiny model was warm-started on), until the
last try. The reward, given when the episode ends, is the per-digit credit of the last attempt
(the share of positions right, over the longer of attempt and answer), less `try_cost` for every
try after the first: 1.0 for a first-try answer, so the policy learns to get it right early.
"""
from __future__ import annotations

from rlfleet.env.base import Environment, Step
from rlfleet.env.types import Action, EpisodeRow, Message

PROMPT_PREFIX = "Reverse the digits: "


def digit_credit(attempt: str, answer: str) -> float:
    digits = "".join(ch for ch in attempt if ch.isdigit())
    width = max(len(digits), len(answer))
    return sum(a == b for a, b in zip(digits, answer)) / width if width else 0.0


class DigitsGame(Environment):
    name = "digits_game"
    description = "Reverse a digit string; a wrong attempt is asked again, up to max_tries."

    def __init__(self, max_tries: int = 2, try_cost: float = 0.25):
        self.max_tries, self.try_cost = max_tries, try_cost

    def start(self, row: EpisodeRow) -> dict:
        if not row.ground_truth.isdigit():
            raise ValueError(f"ground_truth {row.ground_truth!r} is not a digit string")
        return {"answer": row.ground_truth, "tries": 0}

    def _reward(self, state: dict, attempt: str) -> float:
        return digit_credit(attempt, state["answer"]) - self.try_cost * (state["tries"] - 1)

    def step(self, state: dict, action: Action) -> Step:
        state["tries"] += 1
        attempt = action.text.strip()
        if attempt == state["answer"] or state["tries"] >= self.max_tries:
            # env/tries and env/solved in the run's metrics (StepResult.metrics, averaged over episodes)
            return Step(reward=self._reward(state, attempt), done=True,
                        metrics={"tries": float(state["tries"]), "solved": float(attempt == state["answer"])})
        return Step(observation=[Message("user", PROMPT_PREFIX + state["answer"][::-1])])

    def end(self, state: dict, reason: str) -> float | None:
        return None  # stopped before an answer counted: no reward (the episode is left out)
