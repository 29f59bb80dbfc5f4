"""bench/concurrent_plan.py: the overrides bench/onegpu_session.sh gives concurrent runs on one H200
(bench/concurrent_runs.args) pass each run's own memory plan and fit together; what would not is
refused before anything starts, naming the key."""
from pathlib import Path

import pytest

from bench.concurrent_plan import main

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "deploy" / "configs" / "arithmetic-smollm2-135m.yaml")
ARGS = [line for line in (REPO / "bench" / "concurrent_runs.args").read_text().splitlines()
        if line.strip() and not line.startswith("#")]


def test_session_overrides_fit_six_runs_or_three_beside_trl(capsys):
    assert main(["--config", CONFIG, "--runs", "6", "--gpu-gib", "139", *ARGS]) == 0
    assert '"rollout": {"share": 0.085, "estimate_gib": 8.57}' in capsys.readouterr().out
    assert main(["--config", CONFIG, "--runs", "3", "--others-gib", "60", "--gpu-gib", "139", *ARGS]) == 0


def test_small_shares_without_the_prompt_bound_are_refused_as_the_run_would(capsys):
    # 0.08 of 139 GiB is 11.1 GiB; the rollout plans KV cache for 512 x (1,024 assumed + 128) tokens
    assert main(["--config", CONFIG, "--runs", "3", "--gpu-gib", "139", "rollout.gpu_memory_utilization=0.08",
                 "learner.gpu_memory_utilization=0.12"]) == 1
    err = capsys.readouterr().err
    assert "the rollout needs about 26.9 GiB" in err and "rollout.gpu_memory_utilization=0.08" in err


def test_shares_that_add_up_past_the_gpu_are_refused(capsys):
    assert main(["--config", CONFIG, "--runs", "7", "--gpu-gib", "139", *ARGS]) == 1
    assert "7 runs x (rollout.gpu_memory_utilization 0.085" in capsys.readouterr().err


def test_one_run_of_the_135m_gsm8k_job_on_an_h100_takes_the_shares_it_would_derive(capsys):
    # the rollout's 26.85 GiB estimate and 5 % more: 0.36 of a 79.2 GiB H100 (the default 0.30: 23.8 GiB)
    gsm8k = str(REPO / "deploy" / "configs" / "gsm8k-smollm2-135m.yaml")
    assert main(["--config", gsm8k, "--runs", "1", "--gpu-gib", "79.2", "rollout.max_new_tokens=128"]) == 0
    out = capsys.readouterr().out
    assert '"rollout": {"share": 0.36, "estimate_gib": 26.85}' in out and '"learner": {"share": 0.59,' in out
