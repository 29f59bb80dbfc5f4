"""`rlfleet eval` on the embedded tiny model: the reported accuracy matches a count made by hand."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlfleet.data.tasks import make_rows
from tests.e2e.conftest import rlfleet

pytestmark = pytest.mark.e2e

# Greedy decoding of the embedded tiny model reverses these 12 held-out digit strings exactly (it was
# checked on the first 40 rows of this split: 40 of 40). Rows 1, 4, 7 and 10 get a deliberately wrong
# ground truth of 10 digits: with max_new_tokens=8 and one token per digit no answer can match it.
CORRUPTED = {1, 4, 7, 10}
IMPOSSIBLE = "9" * 10


def fixture_rows() -> list[dict]:
    rows = make_rows(12, seed=0, split="test")
    for i in CORRUPTED:
        rows[i]["reward_model"] = {"style": "rule", "ground_truth": IMPOSSIBLE}
    return rows


def test_eval_accuracy_matches_a_hand_count(tmp_path):
    rows = fixture_rows()
    data = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    report = tmp_path / "report.json"
    proc = rlfleet(
        "eval",
        "--model",
        "builtin:tiny",
        "--data",
        str(data),
        "--output",
        str(report),
        "rollout.max_new_tokens=8",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(report.read_text())
    # by hand: 12 prompts, 4 impossible, 8 the model answers exactly -> 8/12
    expected = 8 / 12
    ours = result["by_source"]["digits_reverse"]
    assert (ours["prompts"], ours["samples"], ours["reward_failed"]) == (12, 12, 0)
    assert ours["accuracy"] == pytest.approx(expected)
    assert ours["pass@1"] == pytest.approx(expected)
    assert result["params"]["temperature"] == 0.0 and result["params"]["n"] == 1
    samples = [json.loads(x) for x in (tmp_path / "report.samples.jsonl").read_text().splitlines()]
    assert [s["correct"] for s in samples] == [i not in CORRUPTED for i in range(12)]
    for s, row in zip(samples, rows):
        if s["correct"]:
            assert s["response"].strip() == row["reward_model"]["ground_truth"]
    # the readable table says the same
    table = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    assert table["digits_reverse"][1:4] == ["12", "12", f"{expected:.4f}"]
    # both name the rule that scored it (reward.fn=auto picks `digits` for digits_reverse)
    assert ours["rule"] == "digits" and table["digits_reverse"][-1] == "digits"


def test_eval_bad_input_is_one_clear_line(tmp_path):
    proc = rlfleet(
        "eval", "--model", str(tmp_path / "nowhere"), "--data", str(tmp_path / "x.parquet"), timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--model" in proc.stderr and "nowhere" in proc.stderr and "no such file or folder" in proc.stderr
    proc = rlfleet(
        "eval",
        "--model",
        "builtin:tiny",
        "--data",
        str(tmp_path / "x.parquet"),
        "--n",
        "4",
        "--temperature",
        "0",
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "n identical samples" in proc.stderr


def test_eval_plays_episodes_of_the_builtin_game(tmp_path):
    """With env.name set, `rlfleet eval` serves the environment and every sample is an episode of the
    rollout's agent loop. The same 12 rows: the 8 the model reverses end at the first try (1 turn,
    the game's reward 1.0); the 4 impossible ones are asked again and end after max_tries=2 turns.
    By hand: accuracy 8/12, turns per episode (8*1 + 4*2)/12 = 4/3, no tool calls."""
    rows = fixture_rows()
    data = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    report = tmp_path / "report.json"
    proc = rlfleet("eval", "--model", "builtin:tiny", "--data", str(data), "--output", str(report),
                   "rollout.max_new_tokens=8", "env.name=digits_game", "rollout.max_turns=2", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rlfleet: environment digits_game@127.0.0.1:" in proc.stdout
    result = json.loads(report.read_text())
    ours = result["by_source"]["digits_reverse"]
    assert (ours["samples"], ours["reward_failed"]) == (12, 0)
    assert ours["accuracy"] == pytest.approx(8 / 12)
    assert ours["turns_mean"] == pytest.approx(4 / 3) and ours["tool_calls_mean"] == 0.0
    assert result["env"]["name"] == "digits_game" and result["env"]["max_turns"] == 2
    samples = [json.loads(x) for x in (tmp_path / "report.samples.jsonl").read_text().splitlines()]
    assert [s["turns"] for s in samples] == [2 if i in CORRUPTED else 1 for i in range(12)]
    for i, s in enumerate(samples):
        if i in CORRUPTED:  # the game asked again: its request is in the episode's text
            assert "Reverse the digits: " in s["response"] and s["reward"] < 1.0
        else:
            assert s["reward"] == 1.0
    header, *lines = [line.split() for line in proc.stdout.splitlines() if line.startswith(("data_source",
                                                                                             "digits"))]
    row = lines[0]
    assert row[header.index("turns")] == "1.33" and row[header.index("tools")] == "0.00"
    # the game's reward, where it gave one; the data_source's rule otherwise
    assert ours["rule"] == "env digits_game, else digits"


def test_eval_with_an_unreachable_environment_says_where(tmp_path):
    data = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(fixture_rows()[:2]), data)
    report = tmp_path / "r.json"
    proc = rlfleet("eval", "--model", "builtin:tiny", "--data", str(data), "--output", str(report),
                   "env.address=127.0.0.1:1", "controller.connect_timeout_s=1", timeout=120)
    assert proc.returncode != 0
    assert "environment service at 127.0.0.1:1 is not serving" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not report.exists()
