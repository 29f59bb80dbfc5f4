"""`rlfleet eval` shows its progress (issue 32, from a new user: it was silent for the whole
generation). Off a terminal, where no bar is drawn, a line per request says how many prompts are done;
each group counts as it arrives."""
from __future__ import annotations

import pytest

from rlfleet.data.prompts import Prompt
from rlfleet.eval.runner import run_eval
from rlfleet.types import Completion, GroupResult, SamplingParams, ScoreResult

pytestmark = [pytest.mark.unit]


def _generate(requests, params):
    for r in requests:
        yield GroupResult(r.request_id, [Completion(token_ids=[1], logprobs=[-0.1], finish_reason="stop",
                                                    policy_version=0, text="1")])


def _score(items):
    return [ScoreResult(item.id, 1.0) for item in items]


def test_progress_lines_off_a_terminal(capsys):
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(5)]
    samples = run_eval(prompts, _generate, _score, SamplingParams(n=1), prompts_per_request=2, progress=True)
    assert len(samples) == 5
    out = capsys.readouterr().out
    assert "rlfleet: eval 2/5 prompts" in out and "rlfleet: eval 4/5 prompts" in out
    assert "rlfleet: eval 5/5 prompts" in out, out


def test_no_lines_without_progress(capsys):
    prompts = [Prompt(index=0, text="p", prompt_ids=[1], data_source="digits", ground_truth="1")]
    run_eval(prompts, _generate, _score, SamplingParams(n=1))
    assert "rlfleet: eval" not in capsys.readouterr().out
