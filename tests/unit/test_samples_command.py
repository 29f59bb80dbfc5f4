"""`rlfleet samples RUN_DIR` (issue 43): a run's samples, readable, filtered, or as JSON; and a few
validation samples per evaluation in TensorBoard's text tab. The records are made by the controller's own
record builder (controller.sample_lines.sample_record), as a run writes them."""

from __future__ import annotations

import argparse
import json

import pytest

from controller.groups import ScoredGroup
from controller.sample_lines import sample_record, step_lines
from rlfleet.app.cli import main as cli_main
from rlfleet.app.samples_cli import format_record, reward_filter, select
from rlfleet.data.prompts import Prompt
from rlfleet.errors import DataError
from rlfleet.types import Completion, ScoreResult, TurnRecord

pytestmark = pytest.mark.unit

PROMPT = Prompt(index=7, text="What is 2+3?", prompt_ids=[1], data_source="calc", ground_truth="5")


def single(step: int, reward: float | None, version: int = 0, text: str = "5") -> dict:
    c = Completion(token_ids=[1], logprobs=[-0.1], finish_reason="stop", policy_version=version, text=text)
    r = ScoreResult("x/0", reward if reward is not None else 0.0, ok=reward is not None,
                    error="" if reward is not None else "reward server down")
    return sample_record(step, version + 1, ScoredGroup(0, PROMPT, [c], [r]), c, r)


def episode(step: int, errors: int = 1) -> dict:
    """Two turns: a tool call (one failed when errors=1) answered by the environment, then the answer."""
    turns = (TurnRecord(generated_tokens=9, observed_tokens=4, policy_version=2, last_policy_version=2,
                        tool_calls=1, tool_errors=errors, text='<tool name="calculator">2+3</tool>',
                        observation="error: bad expression" if errors else "5"),
             TurnRecord(generated_tokens=3, observed_tokens=0, policy_version=3, last_policy_version=3,
                        text="<answer>5</answer>", reward=1.0))
    c = Completion(token_ids=list(range(16)), logprobs=[0.0] * 16, finish_reason="stop", policy_version=2,
                   text="…", last_policy_version=3, turns=turns, env_reward=1.0, loss_mask=[1] * 16)
    r = ScoreResult("x/0", 1.0)
    return sample_record(step, 4, ScoredGroup(0, PROMPT, [c], [r]), c, r)


def test_a_single_turn_sample_reads_as_prompt_response_reward_version_staleness():
    text = format_record(single(3, 0.5, version=1))
    lines = text.splitlines()
    assert lines[0] == ("── step 3 · prompt 7 · version 1 · trained at 2 (staleness 1) · reward 0.500 · "
                        "finish stop ──")
    assert lines[1:5] == ["  prompt:", "    What is 2+3?", "  response:", "    5"]
    assert lines[5] == "  ground truth: 5"
    failed = format_record(single(3, None))
    assert "reward -" in failed and "  reward failed: reward server down" in failed


def test_an_episode_reads_turn_by_turn_with_tool_calls_and_masked_spans():
    lines = format_record(episode(5)).splitlines()
    # generated at version 2, trained at 4: staleness 2
    assert lines[0].startswith("── step 5 · prompt 7 · version 2 · trained at 4 (staleness 2) · reward 1.000")
    assert lines[3:11] == [
        "  turn 1 · version 2 · 9 model tokens (in the loss) · finish stop:",
        '    <tool name="calculator">2+3</tool>',
        "    tool calls: calculator(2+3)  [1 failed]",
        "  environment · 4 tokens (masked out of the loss):",
        "    error: bad expression",
        "  turn 2 · version 3 · 3 model tokens (in the loss) · finish stop:",
        "    <answer>5</answer>",
        "  environment reward: 1.000",
    ]


def _args(**kw) -> argparse.Namespace:
    base = dict(step=None, reward=None, failed=False, tool_errors=False, last=0)
    return argparse.Namespace(**{**base, **kw})


def test_filters():
    records = [single(1, 0.0), single(1, 1.0), single(2, None), episode(2), episode(3, errors=0),
               single(3, 0.5)]
    steps = lambda chosen: [(r["step"], r["reward"]) for r in chosen]  # noqa: E731
    assert steps(select(records, _args(step=[2]))) == [(2, None), (2, 1.0)]
    assert steps(select(records, _args(step=[1, 3], reward="<1"))) == [(1, 0.0), (3, 0.5)]
    assert steps(select(records, _args(reward="1"))) == [(1, 1.0), (2, 1.0), (3, 1.0)]
    assert steps(select(records, _args(failed=True))) == [(2, None)]
    assert steps(select(records, _args(tool_errors=True))) == [(2, 1.0)]  # the episode with a failed call
    assert steps(select(records, _args(last=2))) == [(3, 1.0), (3, 0.5)]
    assert reward_filter("!=0")(0.5) and not reward_filter(">= 1")(0.5) and not reward_filter("0")(None)
    with pytest.raises(DataError, match="--reward 'high'"):
        reward_filter("high")
    with pytest.raises(DataError, match="--last must be 0"):
        select(records, _args(last=-1))


def test_command_prints_json_or_text_and_names_a_missing_run(tmp_path, capsys):
    (tmp_path / "run" / "samples").mkdir(parents=True)
    records = [single(1, 0.0), episode(2), single(3, 1.0)]
    (tmp_path / "run" / "samples" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli_main(["samples", str(tmp_path / "run"), "--json", "--step", "2"]) == 0
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == [records[1]]
    assert cli_main(["samples", str(tmp_path / "run"), "--last", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("── step 3 ") and out.count("── step") == 1
    path = tmp_path / "run" / "samples" / "train.jsonl"
    assert out.rstrip().endswith(f"rlfleet: 1 of 3 matching samples shown (3 in {path}); "
                                 "--last 0 shows them all")
    assert cli_main(["samples", str(tmp_path / "nowhere")]) == 2
    assert f"is {tmp_path / 'nowhere'} a run folder?" in capsys.readouterr().err


def test_a_few_validation_samples_go_to_tensorboard_as_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from controller.outputs import RunWriter
    from rlfleet.eval.report import sample_texts
    from rlfleet.eval.scoring import EvalSample

    samples = [EvalSample(prompt_index=i, data_source=src, sample=k, prompt="p", response=f"r{i}{k}",
                          ground_truth="g", length=2, finish_reason="stop", policy_version=0,
                          reward=1.0, answer=f"r{i}{k}")
               for src, prompts in (("a", range(5)), ("b", range(5, 6))) for i in prompts for k in range(2)]
    texts = sample_texts(samples)
    # a: the first three prompts' first samples; b: its only prompt
    assert [line.split(" · ")[0] for line in texts["a"].splitlines() if line.startswith("**")] == [
        "**prompt 0**", "**prompt 1**", "**prompt 2**"]
    assert texts["b"].startswith("**prompt 5** · reward 1.000 · answer `r50` · ground truth `g`")
    assert "    r50" in texts["b"].splitlines()
    writer = RunWriter(tmp_path, tensorboard=True)
    writer.log_texts(3, {f"val/{k}/samples": v for k, v in texts.items()})
    writer.close()
    tb = EventAccumulator(str(tmp_path / "tensorboard"))
    tb.Reload()
    assert {"val/a/samples", "val/b/samples"} <= set(tb.Tags()["tensors"])
    (event,) = tb.Tensors("val/b/samples")
    assert event.step == 3 and event.tensor_proto.string_val[0].decode() == texts["b"]


def test_a_validation_episode_reads_with_its_counts_and_passes_the_tool_error_filter():
    import dataclasses

    from rlfleet.eval.scoring import EvalSample

    s = EvalSample(prompt_index=4, data_source="calc", sample=1, prompt="q", response="call\nanswer 5",
                   ground_truth="5", length=9, finish_reason="stop", policy_version=6, reward=1.0,
                   turns=2, tool_calls=1, tool_errors=1, answer="5")
    record = {"step": 6, "evaluated_version": 6, **dataclasses.asdict(s)}  # as PeriodicEval writes it
    lines = format_record(record).splitlines()
    assert lines[0] == "── step 6 · prompt 4 · calc sample 1 · version 6 · reward 1.000 · finish stop ──"
    assert lines[-2:] == ["  episode: 2 turns, 1 tool calls (1 failed)", "  ground truth: 5 · answer read: 5"]
    assert select([record], _args(tool_errors=True)) == [record]


def test_a_records_fields_and_their_order_are_those_the_samples_file_has_always_had():
    """samples/train.jsonl lines are compared byte for byte across runs: the record's keys, in order."""
    head = ["step", "prompt_index", "prompt", "response", "reward", "reward_error", "version",
            "trained_version", "replica", "last_version", "finish_reason", "ground_truth"]
    assert list(single(3, 1.0)) == head
    assert single(3, None)["reward"] is None and single(3, None)["reward_error"] == "reward server down"
    assert list(episode(3)) == head + ["turns", "env_reward", "env_failure", "env_error"]
    failed = Completion([], [], "stop", 1, env_failure="timeout", env_error="slow", prompt_trim=2,
                        env_metrics={"steps": 1.0})
    r = ScoreResult("x/0", 0.0, ok=False, error="environment: timeout")
    record = sample_record(1, 2, ScoredGroup(0, PROMPT, [failed], [r]), failed, r)
    assert list(record) == head + ["turns", "env_reward", "env_failure", "env_error", "env_metrics",
                                   "prompt_trim"]
    assert (record["turns"], record["env_failure"], record["prompt_trim"]) == ([], "timeout", 2)


def test_a_step_writes_at_most_samples_per_step_records_in_batch_order():
    c = Completion([1], [-0.1], "stop", 0, text="5")
    groups = [ScoredGroup(seq, PROMPT, [c, c], [ScoreResult("x/0", float(seq)), ScoreResult("x/1", 0.5)])
              for seq in range(2)]
    for limit, rewards in ((None, [0.0, 0.5, 1.0, 0.5]), (3, [0.0, 0.5, 1.0]), (0, [])):
        records = [json.loads(line) for line in step_lines(2, 1, groups, limit).splitlines()]
        assert [r["reward"] for r in records] == rewards
