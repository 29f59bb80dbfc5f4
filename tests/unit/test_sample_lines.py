"""samples/train.jsonl lines from record pieces made as each group is scored (controller/sample_lines.py,
issue 44): byte for byte the lines RunWriter.log_samples writes for the records made at the step."""
from __future__ import annotations

import math

import pytest

from controller.groups import ScoredGroup
from controller.outputs import RunWriter
from controller.sample_lines import group_pieces, sample_record, step_lines
from rlfleet.data.prompts import Prompt
from rlfleet.types import Completion, ScoreResult, TurnRecord

pytestmark = pytest.mark.unit

PROMPT = Prompt(index=7, text='What is "2+3"?\n', prompt_ids=[1], data_source="calc", ground_truth="5")


def _groups() -> list[ScoredGroup]:
    plain = Completion([1], [-0.1], "stop", 2, text="5 é ✓", last_policy_version=3)
    turns = (TurnRecord(generated_tokens=9, observed_tokens=4, policy_version=2, last_policy_version=2,
                        tool_calls=1, tool_errors=1, text="<tool>2+3</tool>", observation="error",
                        env_latency_s=0.123456),
             TurnRecord(generated_tokens=3, observed_tokens=0, policy_version=3, last_policy_version=3,
                        text="<answer>5</answer>", reward=1.0))
    episode = Completion(list(range(16)), [0.0] * 16, "stop", 2, text="…", last_policy_version=3, turns=turns,
                         env_reward=1.0, loss_mask=[1] * 16)
    failed = Completion([], [], "length", 1, env_failure="timeout", env_error="slow", prompt_trim=2,
                        env_metrics={"steps": 1.0, "nan": math.nan})
    return [ScoredGroup(0, PROMPT, [plain, episode], [ScoreResult("a/0", 0.5), ScoreResult("a/1", math.inf)],
                        replica="10.0.0.7:7000"),
            ScoredGroup(1, PROMPT, [failed, plain], [ScoreResult("b/0", 0.0, ok=False, error="env: timeout"),
                                                     ScoreResult("b/1", -0.0)])]


def _written(tmp_path, name: str, write) -> bytes:
    writer = RunWriter(tmp_path / name, tensorboard=False)
    write(writer)
    writer.close()
    return (tmp_path / name / "samples" / "train.jsonl").read_bytes()


@pytest.mark.parametrize("limit", [None, 0, 1, 3, 100])
@pytest.mark.parametrize("pieces_made", [True, False])
def test_a_steps_lines_from_record_pieces_are_the_lines_of_its_records(tmp_path, limit, pieces_made):
    groups = _groups()
    if pieces_made:
        for g in groups:
            g.record_pieces = group_pieces(g)
    pairs = [(g, c, r) for g in groups for c, r in zip(g.completions, g.results)][:limit]
    expected = _written(tmp_path, "records", lambda w: w.log_samples(
        [sample_record(12, 11, g, c, r) for g, c, r in pairs]))
    got = _written(tmp_path, "lines", lambda w: w.write_sample_lines(step_lines(12, 11, groups, limit)))
    assert got == expected
    assert got.count(b"\n") == min(4, 4 if limit is None else limit)
