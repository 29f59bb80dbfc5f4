"""The console tells the story (issue 43): the step line's time and ETA, turns / tool calls / tool-error
rate for multi-turn runs, the no-signal flag and the not-learning line, the count of groups without
signal, and the validation table printed at each evaluation. Numbers derived by hand."""

from __future__ import annotations

import pytest

from controller.groups import ScoredGroup
from controller.sample_builder import SampleBuilder
from rlfleet.algorithm import AlgorithmConfig
from rlfleet.app.progress import NO_SIGNAL_STREAK, StepProgress, duration, episode_part
from rlfleet.data.prompts import Prompt
from rlfleet.types import Completion, ScoreResult

pytestmark = pytest.mark.unit

PROMPT = Prompt(index=0, text="q", prompt_ids=[1], data_source="digits_reverse", ground_truth="1")


def metrics(step: int, **extra) -> dict:
    base = {"step": step, "policy_version": step - 1, "reward/mean": 0.5, "reward/std": 0.5,
            "actor/pg_loss": 0.1, "actor/kl_loss": 0.0, "actor/entropy": 1.0, "staleness/mean": 0.0,
            "staleness/max": 0.0, "perf/tokens_per_s": 100.0, "timing/weight_sync_s": 0.01,
            "timing/step_s": 2.0, "groups/trained": 4.0, "groups/no_signal": 1.0}
    return {**base, **extra}


class Clock:
    def __init__(self, *times: float):
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_duration():
    assert [duration(s) for s in (0, 42.4, 250, 7500)] == ["0s", "42s", "4m10s", "2h05m"]


def test_step_time_and_eta_by_hand():
    progress = StepProgress(max_steps=10, clock=Clock(10.0, 14.0, 100.0))
    # step 1: no earlier step, so its own time: step 2.0 s + its evaluation 1.0 s = 3.0 s; 9 left -> 27 s
    (line,) = progress.lines(metrics(1, **{"timing/eval_s": 1.0}))
    assert line.startswith("step    1/10 |") and line.endswith("| 2.00 s/step | ETA 27s")
    # step 2, 4.0 s of wall time after step 1: mean (3 + 4) / 2 = 3.5 s, 8 left -> 28 s
    (line,) = progress.lines(metrics(2, **{"timing/step_s": 3.5}))
    assert line.endswith("| 3.50 s/step | ETA 28s")
    (line,) = progress.lines(metrics(10))  # the last step: nothing left to wait for
    assert "ETA" not in line and line.endswith("| 2.00 s/step")


def test_multi_turn_part_by_hand():
    # 10 tool calls, 1 an error -> 10 %
    part = episode_part({"env/turns_mean": 2.5, "env/tool_calls_per_episode": 1.25, "env/tool_calls": 10.0,
                         "env/tool_errors": 1.0})
    assert part == " | turns 2.50 | tools 1.25/ep | tool errors 10%"
    assert episode_part({"env/turns_mean": 1.0, "env/tool_calls": 0.0}).endswith("tool errors - (no calls)")
    assert episode_part(metrics(1)) == ""  # single-turn: no such part
    line = StepProgress(3, clock=Clock(0.0)).lines(metrics(1, **{"env/turns_mean": 2.0, "env/tool_calls": 4.0,
                                                                 "env/tool_calls_per_episode": 1.0,
                                                                 "env/tool_errors": 0.0}))[0]
    assert "| turns 2.00 | tools 1.00/ep | tool errors 0% |" in line


def test_no_signal_is_flagged_with_the_count_and_a_streak_says_the_run_is_not_learning():
    progress = StepProgress(max_steps=40, clock=lambda: 0.0, run_dir="outputs/x")
    flat = {"groups/no_signal": 4.0, "reward/mean": 0.0, "reward/std": 0.0}
    out = [progress.lines(metrics(1))]  # 1 of 4 groups flat: signal, no flag
    out += [progress.lines(metrics(s, **flat)) for s in range(2, 2 + NO_SIGNAL_STREAK + 1)]  # steps 2-7
    assert "no signal" not in out[0][0]
    assert all(lines[0].endswith("| no signal: 4/4 groups one reward each") for lines in out[1:])
    # one line, once, when the streak reaches NO_SIGNAL_STREAK (steps 2-6), not again at step 7
    assert [len(lines) for lines in out] == [1, 1, 1, 1, 1, 2, 1]
    assert out[5][1].startswith(f"rlfleet: not learning: no signal for {NO_SIGNAL_STREAK} steps in a row "
                                "(steps 2-6) (every sample 0.000): every group's samples got the same reward")
    assert out[5][1].endswith("What it writes: rlfleet samples outputs/x --last 8")
    # a step with signal ends the streak; a new streak is reported again
    assert len(progress.lines(metrics(8))) == 1
    again = [progress.lines(metrics(s, **flat)) for s in range(9, 9 + NO_SIGNAL_STREAK)]
    assert len(again[-1]) == 2 and "(steps 9-13)" in again[-1][1]


def _group(scores: list[float]) -> ScoredGroup:
    completions = [Completion(token_ids=[5, 6], logprobs=[-0.5, -0.5], finish_reason="stop", policy_version=0)
                   for _ in scores]
    results = [ScoreResult(id=f"r/{i}", score=s) for i, s in enumerate(scores)]
    return ScoredGroup(0, PROMPT, completions, results)


def test_builder_counts_the_groups_without_signal():
    groups = [_group([1.0, 1.0]), _group([0.0, 1.0]), _group([0.0, 0.0])]  # the first and last: no signal
    _, m = SampleBuilder(AlgorithmConfig(), max_new_tokens=8).build(groups)
    assert (m["groups/trained"], m["groups/no_signal"]) == (3.0, 2.0)
    # a learner-side estimator (batch-wide normalisation): equal rewards in a group may still carry signal
    _, m = SampleBuilder(AlgorithmConfig(advantage="reinforce_pp"), max_new_tokens=8).build(groups)
    assert "groups/no_signal" not in m


def test_each_validation_prints_the_eval_table(capsys):
    from controller.evaluation import PeriodicEval
    from rlfleet.config import JobConfig
    from rlfleet.types import GroupResult

    cfg = JobConfig.model_validate({"controller": {"eval_every": 2, "max_steps": 4}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1], data_source="digits_reverse", ground_truth=t)
               for i, t in enumerate(["12", "12", "3"])]

    def generate(requests, params):
        for r in requests:  # answers "12" to everything
            yield GroupResult(r.request_id, [Completion(token_ids=[1, 2], logprobs=[-0.1, -0.3],
                                                        finish_reason="stop", policy_version=2, text="12")])

    def score(items):
        return [ScoreResult(item.id, float(item.response == item.ground_truth)) for item in items]

    m = PeriodicEval(cfg, prompts).run(step=2, version=2, generate=generate, score=score)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("rlfleet: validation of policy version 2 at step 2 (3 prompts, ")
    assert out[1].split()[:5] == ["data_source", "prompts", "samples", "accuracy", "baseline"]
    # 2 of 3 right, baseline "12" 2 of 3: accuracy not above it; one answer "12" for all: top share 1.0
    row = out[2].split()
    assert row[:5] == ["digits_reverse", "3", "3", "0.6667", "0.6667"]
    assert row[-3:] == ["1", "1.00", "0.200"]  # distinct, top, NLL (0.1 + 0.3) / 2
    assert out[4] == "note: digits_reverse: 100% of answers are '12' (the most frequent ground truth)"
    assert m["val/digits_reverse/majority_baseline"] == pytest.approx(2 / 3)
    assert m["val/digits_reverse/answers/top_share"] == 1.0


def test_the_end_of_a_run_counts_its_steps_without_signal():
    progress = StepProgress(max_steps=4, clock=lambda: 0.0)
    assert progress.summary() is None  # no step yet
    progress.lines(metrics(1))
    assert progress.summary() is None  # every step had signal: nothing to say
    for step in (2, 3):
        progress.lines(metrics(step, **{"groups/no_signal": 4.0}))
    progress.lines(metrics(4))
    assert progress.summary() == ("rlfleet: 2 of 4 steps had no signal (every group one reward for all its "
                                  "samples): nothing was learned on them")
