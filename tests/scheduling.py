"""The order in which `make test` hands test files to its pytest-xdist workers: the longest first.

Under `--dist loadfile` a file runs whole on one worker, and a worker takes the next file when it is
nearly done with its own. Handed out longest first (and `--no-loadscope-reorder`, which would otherwise
sort the files by their number of tests), the long end-to-end files start early and short ones are
left to fill the gaps, so the workers finish together (sorted by number of tests, the two ~170 s
single-test files started last).

FILE_SECONDS: wall seconds per file, measured under `make test` on the 2-core machine (2026-12-02,
summed per file from each test's setup+call+teardown). They only order the work: a stale figure costs
some time at the end of the run, never a result. A file not listed is guessed from its markers."""
from __future__ import annotations

from collections.abc import Sequence

import pytest

FILE_SECONDS = {
    "tests/e2e/test_tool_warm_start.py": 152,
    "tests/e2e/test_onegpu_calculator_phase.py": 150,
    "tests/e2e/test_algorithms.py": 117,
    "tests/e2e/test_model_import.py": 85,
    "tests/deploy/test_slurm.py": 95,
    "tests/e2e/test_faults.py": 79,
    "tests/e2e/test_onegpu_session_cpu.py": 76,
    "tests/e2e/test_external_reward.py": 75,
    "tests/e2e/test_resume.py": 73,
    "tests/e2e/test_fleet.py": 62,
    "tests/e2e/test_sft.py": 59,
    "tests/e2e/test_environments.py": 58,
    "tests/e2e/test_openenv_run.py": 51,
    "tests/e2e/test_env_failures.py": 45,
    "tests/e2e/test_lifecycle.py": 44,
    "tests/e2e/test_run.py": 43,
    "tests/e2e/test_vllm.py": 40,
    "tests/vllm/test_vllm_engine.py": 56,
    "tests/service/test_weight_rpc_stall.py": 32,
    "tests/service/test_fleet_join_reconnect.py": 31,
    "tests/e2e/test_observability.py": 28,
    "tests/e2e/test_fleet_sim.py": 26,
    "tests/e2e/test_secure_run.py": 23,
    "tests/e2e/test_fleet_status.py": 22,
    "tests/e2e/test_fsdp_learner.py": 21,
    "tests/e2e/test_fleet_drain.py": 21,
    "tests/e2e/test_arithmetic_recipe.py": 18,
    "tests/e2e/test_eval.py": 18,
    "tests/e2e/test_netns.py": 17,
    "tests/unit/test_tiny_model_and_rewards.py": 17,
    "tests/e2e/test_listening_sockets.py": 17,
    "tests/service/test_weight_sync_gloo.py": 16,
    "tests/service/test_waiting_says_why.py": 15,
    "tests/service/test_reward_sdk_and_check.py": 15,
    "tests/e2e/test_replicas.py": 15,
    "tests/service/test_weight_push_bound.py": 15,
    "tests/deploy/test_systemd.py": 13,
    "tests/e2e/test_bad_input.py": 12,
    "tests/unit/test_loop_recovery.py": 12,
    "tests/e2e/test_role_imports.py": 12,
    "tests/service/test_reward_client.py": 12,
    "tests/e2e/test_checker_exit.py": 12,
    "tests/service/test_checker_releases_calls.py": 11,
    "tests/e2e/test_join_sigterm.py": 11,
    "tests/service/test_fuzz.py": 11,
    "tests/e2e/test_env_observability.py": 10,
    "tests/service/test_fleet_join_checks.py": 10,
    "tests/service/test_weight_group_impostor.py": 10,
    "tests/unit/test_fsdp_equivalence.py": 9,
    "tests/service/test_openenv.py": 9,
}
# Guesses for a file not in FILE_SECONDS, per test: one that starts real processes, one that does not.
PROCESS_TEST_S = 15.0
IN_PROCESS_TEST_S = 0.1
PROCESS_MARKERS = ("e2e", "slow", "vllm")


def _guess_s(item: pytest.Item) -> float:
    starts_processes = any(item.get_closest_marker(name) for name in PROCESS_MARKERS)
    return PROCESS_TEST_S if starts_processes else IN_PROCESS_TEST_S


def longest_files_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """The items, their files sorted by FILE_SECONDS (or the guess) descending; within a file, and
    among files of equal cost, the collection order is kept (every worker must collect the same order)."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def cost(path: str) -> float:
        known = FILE_SECONDS.get(path)
        return known if known is not None else sum(_guess_s(item) for item in by_file[path])

    ordered = sorted(by_file, key=cost, reverse=True)  # sorted() is stable: ties keep collection order
    return [item for path in ordered for item in by_file[path]]
