"""The order in which `make test` hands test files to its pytest-xdist workers: the longest first.

Under `--dist loadfile` a file runs whole on one worker, and a worker takes the next file when it is
nearly done with its own. Handed out longest first (and `--no-loadscope-reorder`, which would otherwise
sort the files by their number of tests), the long end-to-end files start early and short ones are
left to fill the gaps, so the workers finish together (sorted by number of tests, the two ~210 s
single-test files started last).

FILE_SECONDS: wall seconds per file, measured under `make test` on the 2-core machine (2026-12-03,
summed per file from each test's setup+call+teardown; Slurm was absent there, its figure is from
2026-12-02). They only order the work: a stale figure costs some time at the end of the run, never a
result. A file not listed is guessed from its markers."""
from __future__ import annotations

from collections.abc import Sequence

import pytest

FILE_SECONDS = {
    "tests/e2e/test_tool_warm_start.py": 216,
    "tests/e2e/test_onegpu_calculator_phase.py": 210,
    "tests/e2e/test_model_import.py": 178,
    "tests/e2e/test_algorithms.py": 151,
    "tests/e2e/test_external_reward.py": 125,
    "tests/e2e/test_sft.py": 117,
    "tests/e2e/test_faults.py": 145,
    "tests/e2e/test_onegpu_session_cpu.py": 102,
    "tests/deploy/test_slurm.py": 95,
    "tests/e2e/test_resume.py": 122,
    "tests/e2e/test_environments.py": 75,
    "tests/e2e/test_fleet.py": 72,
    "tests/e2e/test_stall.py": 71,  # measured alone on the 2-core machine, 2026-12-05 (issue 42)
    "tests/e2e/test_vllm.py": 64,
    "tests/e2e/test_openenv_run.py": 64,
    "tests/e2e/test_lifecycle.py": 62,
    "tests/e2e/test_run.py": 61,
    "tests/e2e/test_env_failures.py": 59,
    "tests/e2e/test_first_day.py": 55,  # this and the next: measured alone (-p no:xdist), 2026-12-05
    "tests/vllm/test_vllm_engine.py": 53,
    "tests/e2e/test_first_day_page.py": 39,
    "tests/service/test_weight_rpc_stall.py": 32,
    "tests/service/test_fleet_join_reconnect.py": 31,
    "tests/e2e/test_fsdp_learner.py": 30,
    "tests/e2e/test_eval.py": 29,
    "tests/e2e/test_secure_run.py": 29,
    "tests/unit/test_tiny_model_and_rewards.py": 29,
    "tests/e2e/test_observability.py": 29,
    "tests/e2e/test_fleet_status.py": 28,
    "tests/e2e/test_fleet_drain.py": 27,
    "tests/e2e/test_fleet_sim.py": 60,
    "tests/unit/test_fleetsim_rendezvous.py": 1,
    "tests/unit/test_fleetsim_measure.py": 1,
    "tests/unit/test_stamped_condition.py": 1,
    "tests/unit/test_dataplane_payload.py": 1,
    "tests/service/test_dataplane_flight.py": 1,
    "tests/service/test_dataplane_round_trip.py": 1,
    "tests/e2e/test_data_plane.py": 50,
    "tests/unit/test_payload_loss.py": 1,
    "tests/service/test_payload_release.py": 1,
    "tests/unit/test_data_plane_address.py": 1,
    # issue 44, staging: measured alone (-p no:xdist) on the 2-core machine, 2026-12-05
    "tests/e2e/test_data_plane_staging.py": 14,
    "tests/unit/test_dataplane_staging.py": 1,
    "tests/service/test_dataplane_staged_train.py": 3,
    "tests/e2e/test_netns.py": 20,
    "tests/e2e/test_arithmetic_recipe.py": 20,
    "tests/e2e/test_replicas.py": 18,
    "tests/e2e/test_bad_input.py": 17,
    "tests/service/test_waiting_says_why.py": 15,
    "tests/service/test_weight_push_bound.py": 15,
    "tests/e2e/test_role_imports.py": 14,
    "tests/unit/test_static_decode.py": 14,
    "tests/service/test_reward_sdk_and_check.py": 14,
    "tests/service/test_weight_sync_gloo.py": 13,
    "tests/unit/test_loop_recovery.py": 12,
    "tests/unit/test_learner_master_weights.py": 12,  # 9.4 s at load 3.5, 27.7 s at 6 (2026-12-05)
    "tests/service/test_reward_client.py": 12,
    "tests/e2e/test_listening_sockets.py": 11,
    "tests/e2e/test_load_failures.py": 11,
    "tests/e2e/test_env_observability.py": 11,
    "tests/service/test_weight_group_impostor.py": 11,
    "tests/deploy/test_systemd.py": 11,
    "tests/service/test_fuzz.py": 11,
    "tests/service/test_checker_releases_calls.py": 10,
    "tests/unit/test_fsdp_equivalence.py": 10,
    "tests/service/test_fleet_join_checks.py": 10,
    "tests/service/test_fleet_keepalive.py": 8,
    "tests/unit/test_journal_lines.py": 1,
    "tests/unit/test_convert_hot_paths.py": 1,  # 2026-12-05, alone, load ~1.4: 8.2 s
    "tests/service/test_fleet_stalls.py": 10,  # 2026-12-05, alone on a quiet 2-core machine: 9.8 s
    "tests/unit/test_learner_compile.py": 10,
    "tests/service/test_openenv.py": 9,
    "tests/e2e/test_checker_exit.py": 9,
    "tests/service/test_env_contract_revision.py": 1,  # 2026-12-05, alone: 1.1 s
    "tests/unit/test_weight_group_abort.py": 3,  # 2026-12-05, alone: 3.1 s (2.5 the tiny model)
    "tests/unit/test_weight_sync_abort.py": 1,  # 2026-12-05, alone: 0.04 s
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
