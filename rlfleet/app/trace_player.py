"""Plays the traces of `rlfleet data traces`: the scripted teacher's turns against an environment server.

All episodes run side by side, one batched Start, then one batched Step a turn (the rollout's client,
rlfleet/data/traces.py for the teacher), each call parsed from the turn's text by the agent loop's own
parser, so the environment sees exactly what it would see from a model writing that text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlfleet.data.traces import Teacher, tool_message, trace_row
from rlfleet.env.toolcalls import parse_tool_calls
from rlfleet.env.types import Action, EpisodeRow
from services.reward.fns.final_number import compute_score

WRONG, FAILED, NOT_ENDED = "wrong answer", "environment failed", "not ended by the environment"


@dataclass
class _Trace:
    episode_id: str
    row: dict[str, Any]
    teacher: Teacher
    messages: list[dict[str, Any]]
    calls: int = 0
    answered: bool = False  # the final answer was sent
    outcome: str = ""  # "" while running; "ok", or why it is dropped


def play_traces(client, rows: list[dict[str, Any]], tool: str,
                tools_json: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The right traces as rows (rlfleet/data/traces.py), and how many were dropped, by reason."""
    traces = [_Trace(f"trace-{i}", row, Teacher.for_row(row, tool),
                     [{"role": m["role"], "content": m["content"]} for m in row["prompt"]])
              for i, row in enumerate(rows)]
    starts = [EpisodeRow(t.episode_id, t.row["data_source"], "\n".join(m["content"] for m in t.messages),
                         str(t.row["reward_model"]["ground_truth"]), dict(t.row.get("extra_info") or {}))
              for t in traces]
    results, _ = client.start(starts)
    for t, result in zip(traces, results):
        if not result.ok or result.done:
            t.outcome = FAILED
        else:  # an opening observation (none from the calculator) is part of the prompt
            t.messages += [tool_message(m, "") for m in result.observation.messages]
    turn = 0
    while running := [t for t in traces if not t.outcome]:
        turn += 1
        actions = [_next_action(t, turn) for t in running]
        results, _ = client.step(actions)
        for t, result in zip(running, results):
            _take(t, result, turn)
    for t in traces:
        if t.outcome == "ok":
            answer = t.messages[-1]["content"]
            truth = str(t.row["reward_model"]["ground_truth"])
            if compute_score(t.row["data_source"], answer, truth) != 1.0:
                t.outcome = WRONG
    dropped = {why: sum(t.outcome == why for t in traces) for why in (WRONG, FAILED, NOT_ENDED)}
    kept = [trace_row(t.row, t.messages, tools_json, t.calls) for t in traces if t.outcome == "ok"]
    return kept, dropped


def _next_action(t: _Trace, turn: int) -> Action:
    if t.teacher.calls_left:
        text = t.teacher.call_turn_text()
        t.messages.append(t.teacher.call_message(f"call_{turn}"))
    else:
        text = t.teacher.answer()
        t.messages.append({"role": "assistant", "content": text})
        t.answered = True
    return Action(episode_id=t.episode_id, text=text, tool_calls=parse_tool_calls(text), turn=turn)


def _take(t: _Trace, result, turn: int) -> None:
    if not result.ok:
        t.outcome = FAILED
    elif t.answered:
        t.outcome = "ok" if result.done else NOT_ENDED
    elif result.done:  # the environment ended the episode on a call: no answer to train on
        t.outcome = NOT_ENDED
    else:
        t.calls += 1
        t.teacher.take_result(result.observation.messages)
        t.messages += [tool_message(m, f"call_{turn}") for m in result.observation.messages]
