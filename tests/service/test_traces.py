"""`rlfleet data traces`: conversations whose every tool result comes from a real environment server
(served in-process by --env, or reached at --env-address), in the OpenAI messages format, right ones
only (the wrong ones dropped and counted), and rendered for SFT into the agent loop's tokens."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from environments.calculator import Calculator, evaluate
from rlfleet.app.cli import main
from rlfleet.app.env_sdk import serve
from rlfleet.data.conversation import ConversationRenderer
from rlfleet.env.base import Step
from rlfleet.env.types import Message, Observation

pytestmark = pytest.mark.service


class SloppyCalculator(Calculator):
    """A real calculator that is wrong by one on every product: its traces come out wrong."""

    def step(self, state, action):
        result = super().step(state, action)
        if not action.tool_calls or "*" not in str(action.tool_calls[0].arguments):
            return result
        wrong = [Message(m.role, str(int(m.content) + 1), m.name)
                 for m in Observation.of(result.observation).messages]
        return Step(observation=wrong, tool_errors=result.tool_errors)


def _read(path):
    return pq.read_table(path).to_pylist()


def test_traces_are_played_against_the_calculator_server(tmp_path, capsys):
    out = tmp_path / "traces.parquet"
    assert main(["data", "traces", "--env", "calculator", "--task", "arithmetic", "--level", "hard",
                 "--rows", "40", "--output", str(out)]) == 0
    said = capsys.readouterr().out
    assert "wrote 40 traces (arithmetic, hard;" in said and "dropped 0 of 40" in said
    rows = _read(out)
    assert len(rows) == 40
    for row in rows:
        tools = json.loads(row["tools"])
        assert [t["function"]["name"] for t in tools] == ["calculator"]  # the server's Describe
        messages = row["messages"]
        assert messages[0]["role"] == "user" and messages[-1]["role"] == "assistant"
        calls = [m for m in messages if m["role"] == "assistant" and m["tool_calls"]]
        results = [m for m in messages if m["role"] == "tool"]
        assert len(calls) == len(results) == row["extra_info"]["tool_calls"] in (2, 3)
        for call, result in zip(calls, results):
            (tool_call,) = call["tool_calls"]
            expression = json.loads(tool_call["function"]["arguments"])["expression"]
            assert result["content"] == str(evaluate(expression))  # what the server answered
            assert result["tool_call_id"] == tool_call["id"] and result["name"] == "calculator"
        truth = row["reward_model"]["ground_truth"]
        assert messages[-1]["content"].endswith(f"#### {truth}") and results[-1]["content"] == truth
    # the test side stays held out: traces come from train rows only
    assert {r["extra_info"]["split"] for r in rows} == {"train"}


def test_wrong_traces_are_dropped_and_counted_at_an_env_address(tmp_path, capsys):
    out = tmp_path / "traces.parquet"
    with serve(SloppyCalculator(), block=False) as server:
        assert main(["data", "traces", "--env-address", server.address, "--rows", "30", "--seed", "2",
                     "--level", "easy", "--output", str(out)]) == 0
    said = capsys.readouterr().out
    rows = _read(out)
    products = 30 - len(rows)
    assert products > 0 and f"dropped {products} of 30: {products} wrong answer" in said
    assert all("*" not in r["extra_info"]["answer"] for r in rows)  # only the sloppy products were dropped
    with serve(SloppyCalculator(), block=False) as server:  # every hard problem has a product
        assert main(["data", "traces", "--env-address", server.address, "--level", "hard", "--rows", "5",
                     "--output", str(tmp_path / "none.parquet")]) == 2
    assert not (tmp_path / "none.parquet").exists()
    assert "no trace of 5 was right" in capsys.readouterr().err


def test_traces_render_into_the_tokens_sft_trains_on(tmp_path):
    from rlfleet.models.tiny import build_tokenizer

    out = tmp_path / "traces.parquet"
    assert main(["data", "traces", "--env", "calculator", "--rows", "5", "--instruction", "",
                 "--tools-in-prompt", "false", "--output", str(out)]) == 0
    tok = build_tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for row in _read(out):
        assert row["tools"] == ""
        rendered = ConversationRenderer(tok, [eos]).render(row["messages"], row["tools"])
        trained = tok.decode([t for t, m in zip(rendered.response_ids, rendered.response_mask) if m])
        assert trained.startswith('<tool_call>{"name": "calculator", "arguments": {"expression": "')
        assert trained.endswith(f"#### {row['reward_model']['ground_truth']}<|im_end|>")
        shown = tok.decode([t for t, m in zip(rendered.response_ids, rendered.response_mask) if not m])
        assert "<|im_start|>tool\n" in shown
