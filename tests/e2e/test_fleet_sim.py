"""The fleet simulator (bench/fleet_sim.py) keeps working: 16 simulated replicas, the real controller,
reward service and learner servicer in processes of their own, a few seconds of churn (replicas
killed and joining, one 5x slower, the learner paused): nothing lost, nothing trained twice, the
staleness bound held, and the figures it reports are there."""
from __future__ import annotations

import pytest

from bench.fleet_sim import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STALENESS = 1


@pytest.mark.parametrize("data_plane", ["inline", "flight"])
def test_sixteen_simulated_replicas_under_churn_lose_nothing_and_hold_the_bound(tmp_path, data_plane):
    # flight: a killed replica takes the tokens of its groups not yet trained along; the learner's
    # fetch fails and the controller re-queues them (requeued "payload_lost", when a kill hits one)
    result = main(["--replicas", "16", "--staleness", str(STALENESS), "--seconds", "8", "--warmup", "0",
                   "--out", str(tmp_path), "--prompts-per-request", "2", "--max-new-tokens", "128",
                   "--target-rate", "20", "--churn", "--churn-per-min", "1.25", "--churn-clock", "wall",
                   "--pause-at", "2", "--pause-s", "2", "--start-timeout", "240", "--data-plane", data_plane])
    assert result["data_plane"] == data_plane
    assert result["lost"] == [] and result["trained_twice"] == []
    assert result["stranded"] == [] and result["invariant_errors"] == []  # main() exits 1 otherwise
    assert result["staleness_max"] <= STALENESS
    assert result["killed"] >= 1 and result["joined_late"] >= 1  # the churn happened
    assert result["groups"] > 0 and result["controller_cpu_ms_per_group"] > 0
    assert sum(result["staleness_hist"].values()) >= result["groups"]
