"""The loop stops a run that trains no step for controller.max_stall_s with one line naming why, and
any stop that ends a run (an outage, a stall) checkpoints the last finished step (issue 42, 7: an
outage stop left `checkpoints/` empty while status promised a resume). In process, with the fake
clients of tests/unit/test_loop_recovery.py (real loop, journal and writer)."""
from __future__ import annotations

import json

import pytest

from controller.journal import read_journal
from controller.reward_outage import RewardOutageExpired
from controller.stall import RunStalled
from controller.state import load_state, state_path
from rlfleet.types import ScoreResult
from tests.unit.test_loop_recovery import Faults, fast_retries, make_loop, run_loop  # noqa: F401

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def test_a_reward_outage_stop_after_a_step_writes_that_steps_checkpoint(tmp_path):
    faults = Faults()
    faults.after_train.append(("reward", "score", 100000))  # the reward goes down for good after step 1
    loop, learner = make_loop(tmp_path, faults, staleness=0, max_outage_s=0.5, steps=5)
    saved = []
    learner.save_checkpoint = lambda step: saved.append(step) or f"checkpoints/step_{step}"
    error = run_loop(loop, limit_s=60)
    assert isinstance(error, RewardOutageExpired), repr(error)
    assert learner.trained_steps == [1] and saved == [1]
    assert load_state(state_path(tmp_path, 1)).step == 1  # controller.resume=latest can continue
    events = [e["event"] for e in read_journal(tmp_path / "journal" / "prompts.jsonl")]
    assert "checkpointed_on_stop" in events


def test_groups_that_never_have_two_rewards_stall_the_run_which_stops_with_the_line(tmp_path):
    """Every group comes back with one rewarded sample of four: each is dropped as unusable, no step
    trains, and after controller.max_stall_s the run stops naming the drops, with a checkpoint of the
    last step it finished."""
    faults = Faults()
    loop, learner = make_loop(tmp_path, faults, staleness=1, steps=50)
    loop.cfg.controller.max_stall_s = 2.0
    loop.stall.max_stall_s = 2.0
    original = loop.reward.score

    def one_reward_a_group(items):
        results = original(items)
        if not learner.trained_steps:  # the first step trains normally
            return results
        return [r if r.id.endswith("/0") else ScoreResult(r.id, 0.0, ok=False, error="no reward")
                for r in results]

    loop.reward.score = one_reward_a_group
    saved = []
    learner.save_checkpoint = lambda step: saved.append(step) or f"checkpoints/step_{step}"
    error = run_loop(loop, limit_s=60)
    assert isinstance(error, RunStalled), repr(error)
    line = str(error)
    assert "\n" not in line
    assert line.startswith("no step trained for ") and "controller.max_stall_s=2" in line, line
    assert "groups dropped (unusable" in line and "fewer than 2 samples with a reward" in line, line
    assert "samples got no reward" in line and "1 rollout replica live" in line, line
    # step 1 trained, then nothing: step 2's groups never had two rewards
    assert learner.trained_steps[:1] == [1] and saved == learner.trained_steps[-1:]
    # the dropped samples are counted; the failed ones written at a bounded rate
    samples = [json.loads(x) for x in (tmp_path / "samples" / "train.jsonl").read_text().splitlines()]
    assert all(s.get("dropped") is None for s in samples if s["step"] == 1)


def test_a_replica_down_is_waited_for_by_service_wait_s_not_cut_short_by_the_stall_limit(tmp_path):
    """The stall limit leaves a replica being waited for to controller.service_wait_s (20 s here), and its
    weight resync to learner.weight_sync_timeout_s: down for 5 s against a 2 s stall limit, it comes back
    and the run finishes. (At 0.5 s the fresh-clone suite on a loaded machine stopped the run during the
    resync and the regeneration after it: the resync now holds the clock too, and 2 s leaves the tiny
    model's generation and step room.)"""
    import time

    from rlfleet.errors import ServiceUnavailable

    faults = Faults()
    loop, learner = make_loop(tmp_path, faults, staleness=0, steps=3)
    loop.stall.max_stall_s = 2.0
    rollout = loop.rollouts[0]
    down = {"until": None}
    generate, status = rollout.generate, rollout.status

    def failing_generate(requests, params, payload_sink=""):
        if learner.trained_steps == [1] and down["until"] is None:
            down["until"] = time.monotonic() + 5.0
            raise ServiceUnavailable(f"rollout service at {rollout.address}: Generate: UNAVAILABLE")
        yield from generate(requests, params, payload_sink)

    def down_status(timeout_s: float = 10.0):
        if down["until"] is not None and time.monotonic() < down["until"]:
            raise ServiceUnavailable(f"rollout service at {rollout.address}: connection refused")
        return status(timeout_s)

    rollout.generate, rollout.status = failing_generate, down_status
    assert run_loop(loop, limit_s=60) is None
    assert learner.trained_steps == [1, 2, 3] and down["until"] is not None


def test_a_full_buffer_is_taken_with_one_stall_check_not_one_a_group(tmp_path):
    """The outage and stall checks run as the loop looks at the buffer, not per buffered group
    (issue 44: a median over the step times and a dozen calls a group on the training thread)."""
    import heapq

    from controller.groups import ScoredGroup
    from rlfleet.data.prompts import Prompt
    from rlfleet.types import Completion

    loop, _ = make_loop(tmp_path, Faults(), staleness=1)
    prompt = Prompt(index=0, text="p", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
    for seq in range(3 * loop.B):
        group = ScoredGroup(seq, prompt, [Completion([5], [-0.1], "stop", 0)] * 2,
                            [ScoreResult(f"r/{i}", float(i)) for i in range(2)])
        heapq.heappush(loop._buffer, (group.version, seq, group))
    checks = []
    expired = loop.stall.expired
    loop.stall.expired = lambda facts: checks.append(1) or expired(facts)
    batch, dropped = loop._take_batch(0)
    assert [g.seq for g in batch] == list(range(loop.B)) and not dropped
    assert len(checks) == 1
    assert len(loop._buffer) == 2 * loop.B  # the rest stay buffered
