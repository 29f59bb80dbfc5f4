"""The loop's recovery, in process, against fake rollout / reward / learner clients that fail on
purpose: each failing service in each phase (generate, score, train, push), in synchronous
(max_staleness=0) and asynchronous runs. Every run must finish its steps with the failure
attributed to the service that failed, and the journal must show that nothing admitted was lost
or trained twice. A reward outage pauses admission and ends the run only after reward.max_outage_s,
naming the cause."""
from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.journal import Journal, audit, read_journal
from controller.loop import GRPOLoop
from controller.payload_release import payload_releaser
from controller.outputs import RunWriter
from controller.reward_outage import RewardOutageExpired
from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, PromptSource
from rlfleet.errors import Busy, ServiceUnavailable, WeightSyncError
from rlfleet.types import Completion, GroupResult, ScoreResult, ServiceStatus, TrainResult

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    """The loop's retry backoff from 0.05 s instead of 0.5 s (controller.recovery.RETRY_FIRST_S): the
    same doubling, the same order of events, a tenth of the waiting."""
    import controller.recovery

    monkeypatch.setattr(controller.recovery, "RETRY_FIRST_S", 0.05)


class Faults:
    """Which calls fail: `arm(service, call, times)`; the fleet's phase says what the learner is doing."""

    def __init__(self) -> None:
        self.armed: Counter[tuple[str, str]] = Counter()
        self.fired: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()
        self.after_train: list[tuple[str, str, int]] = []  # armed once the learner first trains

    def arm(self, service: str, call: str, times: int = 1) -> None:
        with self.lock:
            self.armed[(service, call)] += times

    def fire(self, service: str, call: str) -> bool:
        with self.lock:
            if self.armed[(service, call)] > 0:
                self.armed[(service, call)] -= 1
                self.fired[(service, call)] += 1
                return True
        return False


class FakeRollout:
    address = "fake-rollout:1"

    def __init__(self, faults: Faults) -> None:
        self.faults, self.version = faults, 0

    def generate(self, requests, params, payload_sink=""):
        for k, request in enumerate(requests):
            if k == 1 and self.faults.fire("rollout", "generate"):  # mid-stream, after one group
                raise ServiceUnavailable("rollout service at fake-rollout:1: Generate failed: UNAVAILABLE")
            yield GroupResult(request.request_id, [
                Completion(token_ids=[5, 6, 7], logprobs=[-0.5] * 3, finish_reason="stop",
                           policy_version=self.version, text=str(i % 2)) for i in range(params.n)])

    def status(self, timeout_s: float = 10.0) -> ServiceStatus:
        return ServiceStatus("rollout", True, self.version, stats={"weight_ranks": 1})

    def kept_status(self) -> None:
        return None  # no kept-alive channel watches it: every re-form asks its status

    def join_weight_group(self, *args) -> None:
        pass

    def pull_weights(self, version, timeout_s, digest=False):
        if self.faults.fire("rollout", "push"):
            raise WeightSyncError("rollout service at fake-rollout:1: PullWeights failed with ABORTED")
        self.version = version
        return SimpleNamespace(version=version, digest="d")


class FakeReward:
    address = "fake-reward:2"

    def __init__(self, faults: Faults) -> None:
        self.faults, self.calls = faults, 0

    def score(self, items):
        self.calls += 1
        if self.faults.fire("reward", "score"):
            raise ServiceUnavailable("reward service at fake-reward:2: Score failed with UNAVAILABLE: "
                                     "Connection refused")
        return [ScoreResult(item.id, float(k % 2)) for k, item in enumerate(items)]

    def step_metrics(self, groups) -> dict[str, float]:
        return {}


class FakeLearner:
    address = "fake-learner:3"

    def __init__(self, faults: Faults) -> None:
        self.faults, self.version = faults, 0
        self.results: dict[int, TrainResult] = {}
        self.trained_steps: list[int] = []

    def train(self, batch):
        for service, call, times in self.faults.after_train:  # e.g. the reward goes down meanwhile
            self.faults.arm(service, call, times)
        self.faults.after_train.clear()
        if batch.step in self.results:  # Train is idempotent by step: the stored result
            return self.results[batch.step]
        assert batch.expected_version == self.version
        self.version += 1
        self.trained_steps.append(batch.step)
        self.results[batch.step] = TrainResult(self.version, {"actor/pg_loss": 0.0})
        if self.faults.fire("learner", "train"):  # the step ran, the reply was lost
            raise ServiceUnavailable("learner service at fake-learner:3: Train failed with DEADLINE_EXCEEDED")
        return self.results[batch.step]

    def status(self) -> ServiceStatus:
        return ServiceStatus("learner", True, self.version)

    def open_weight_group(self, world_size, timeout_s, placements=None):
        return "fake-group:4", "gloo"

    def push_weights(self, version, timeout_s, digest=False, group=""):
        if self.faults.fire("learner", "push"):
            raise WeightSyncError("learner service at fake-learner:3: PushWeights failed with ABORTED")
        return SimpleNamespace(digest="d")

    def abort_weight_group(self, group, reason) -> bool:
        return False  # its push waits for nothing

    def save_checkpoint(self, step) -> str:
        return f"checkpoints/step_{step}"


def make_loop(tmp_path: Path, faults: Faults, staleness: int, max_outage_s: float = 60.0,
              steps: int = 3) -> tuple[GRPOLoop, FakeLearner]:
    cfg = JobConfig.model_validate({
        "run": {"output_dir": str(tmp_path), "name": "fake"},
        "controller": {"prompts_per_step": 2, "max_staleness": staleness, "max_steps": steps,
                       "prompts_per_request": 2, "service_wait_s": 20},
        "rollout": {"n": 4}, "reward": {"max_outage_s": max_outage_s}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(16)]
    learner = FakeLearner(faults)
    writer = RunWriter(tmp_path, tensorboard=False)
    loop = GRPOLoop(cfg, PromptSource(prompts, seed=0), FakeRollout(faults), FakeReward(faults), learner,
                    writer, journal=Journal(tmp_path))
    return loop, learner


def run_loop(loop: GRPOLoop, limit_s: float = 60.0) -> BaseException | None:
    """Runs the loop in a thread; a loop still running after `limit_s` fails the test (and is stopped)."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            loop.run()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        loop.stop.set()
        thread.join(10)
        pytest.fail(f"the loop did not finish within {limit_s:g}s (waiting forever?)")
    loop.journal.close()
    loop.writer.close()
    return outcome[0]


# (service, the call that fails, phase, the journal event that attributes it)
CASES = [
    ("rollout", "generate", "generate", "rollout_failed"),
    ("rollout", "push", "push", "weight_sync_failed"),
    ("reward", "score", "score", "reward_outage"),
    ("reward", "score", "train", "reward_outage"),
    ("learner", "train", "train", "learner_failed"),
    ("learner", "push", "push", "weight_sync_failed"),
]


@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.parametrize(("service", "call", "phase", "event"), CASES,
                         ids=[f"{s}-fails-during-{p}" for s, _, p, _ in CASES])
def test_each_failure_in_each_phase_is_recovered_without_losing_a_prompt(tmp_path, staleness, service, call,
                                                                         phase, event):
    faults = Faults()
    times = 3 if service == "reward" else 1
    if phase in ("train", "push"):  # not the initial weight sync: the first step's
        faults.after_train.append((service, call, times))
    else:
        faults.arm(service, call, times)
    loop, learner = make_loop(tmp_path, faults, staleness)
    error = run_loop(loop)
    assert error is None, repr(error)
    assert faults.fired[(service, call)] == times
    assert learner.trained_steps == [1, 2, 3]  # each step trained once, a lost reply fetched, not retrained
    events = [e["event"] for e in read_journal(tmp_path / "journal" / "prompts.jsonl")]
    assert event in events
    wrong = {"rollout_failed", "learner_failed", "reward_outage"} - {event}
    if service != "rollout" or call != "push":
        assert not wrong & set(events), events  # attributed to the service that failed, only
    result = audit(tmp_path / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []


def test_reward_outage_pauses_admission_and_groups_wait_for_their_reward(tmp_path):
    faults = Faults()
    faults.arm("reward", "score", 4)  # about 0.05 + 0.1 + 0.2 + 0.4 s of backoff (fast_retries)
    loop, _ = make_loop(tmp_path, faults, staleness=0)
    assert run_loop(loop) is None
    journal = read_journal(tmp_path / "journal" / "prompts.jsonl")
    kinds = [e["event"] for e in journal]
    assert kinds.count("reward_outage") == 1 and kinds.count("reward_back") == 1  # one per state change
    during = kinds[kinds.index("reward_outage"):kinds.index("reward_back")]
    assert "dispatched" not in during  # admission paused
    assert "dropped" not in kinds  # the group waited: nothing was thrown away
    result = audit(tmp_path / "journal" / "prompts.jsonl")
    assert result.lost == [] and result.trained_twice == []


def test_reward_outage_longer_than_max_outage_ends_the_run_naming_the_cause(tmp_path):
    faults = Faults()
    faults.arm("reward", "score", 1000)
    loop, _ = make_loop(tmp_path, faults, staleness=0, max_outage_s=0.5)
    error = run_loop(loop, limit_s=30)
    assert isinstance(error, RewardOutageExpired), repr(error)
    assert "reward.max_outage_s=0.5" in str(error) and "Connection refused" in str(error)
    assert "fake-reward:2" in str(error)
    result = audit(tmp_path / "journal" / "prompts.jsonl")
    assert result.lost == []  # the groups that waited are re-queued for a resumed run


def test_reward_failure_counts_failed_items_and_whole_failed_groups(tmp_path):
    faults = Faults()
    loop, _ = make_loop(tmp_path, faults, staleness=0, steps=2)
    original = loop.reward.score

    def score(items):  # every sample of one group of the second call gets no reward: dropped as unusable
        results = original(items)
        if loop.reward.calls != 2:
            return results
        group = items[0].id.rsplit("/", 1)[0]  # a call may score several groups (batched scoring)
        return [ScoreResult(r.id, 0.0, ok=False, error="reward function failed")
                if r.id.startswith(group + "/") else r for r in results]

    loop.reward.score = score
    assert run_loop(loop) is None
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(m["reward/failed"] for m in metrics) == 4
    assert sum(m["reward/failed_groups"] for m in metrics) == 1


@pytest.mark.parametrize("call", ["push", "train", "checkpoint"])
def test_a_learner_busy_with_another_weight_operation_is_waited_for(tmp_path, call):
    """Issue 32: the learner refuses a push, a Train or a checkpoint with Busy (RESOURCE_EXHAUSTED)
    while it runs a push someone else asked for (without a token anyone may). It ends; the
    controller's call is then retried instead of ending the run."""
    faults = Faults()
    loop, learner = make_loop(tmp_path, faults, staleness=0)
    loop.cfg.learner.checkpoint_every = 1
    refusals = {"left": 2}
    method = {"push": "push_weights", "train": "train", "checkpoint": "save_checkpoint"}[call]
    original = getattr(learner, method)

    def busy_at_first(*args, **kwargs):
        if learner.trained_steps and refusals["left"] > 0:  # not the initial sync: during the run
            refusals["left"] -= 1
            raise Busy("learner service at fake-learner:3: PushWeights failed with RESOURCE_EXHAUSTED: "
                       "Busy: PushWeights refused: PushWeights is in progress on this learner")
        return original(*args, **kwargs)

    setattr(learner, method, busy_at_first)
    assert run_loop(loop) is None
    assert refusals["left"] == 0
    assert learner.trained_steps == [1, 2, 3]
    assert audit(tmp_path / "journal" / "prompts.jsonl").trained_twice == []


def test_on_the_data_plane_generation_pushes_to_the_learners_sink_it_reported_last(tmp_path):
    """controller.data_plane=flight: each GenerateRequest names the learner's staging store (its
    GetStatus payload_sink), read at the start and again whenever the learner's version is checked, as
    after a failed push: a learner restarted since stages at another port."""
    faults = Faults()
    faults.after_train.append(("learner", "push", 1))
    loop, learner = make_loop(tmp_path, faults, staleness=0, steps=2)
    loop.cfg.controller.data_plane = "flight"
    loop.releaser = payload_releaser(loop.cfg, lambda: loop.payload_sink)
    sinks: list[str] = []
    generate = loop.rollout.generate

    def recording(requests, params, payload_sink=""):
        sinks.append(payload_sink)
        return generate(requests, params, payload_sink)

    loop.rollout.generate = recording
    learner.sink = "10.0.0.3:5001"
    train = learner.train

    def restarting(batch):  # the learner comes back on another port after this step
        result = train(batch)
        learner.sink = "10.0.0.3:5002"
        return result

    learner.train = restarting
    learner.status = lambda: ServiceStatus("learner", True, learner.version, payload_sink=learner.sink)
    assert run_loop(loop) is None
    assert faults.fired[("learner", "push")] == 1
    assert sinks[0] == "10.0.0.3:5001" and sinks[-1] == "10.0.0.3:5002", sinks
    assert set(sinks) == {"10.0.0.3:5001", "10.0.0.3:5002"}
    loop.releaser.close()
