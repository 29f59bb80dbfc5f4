"""Each servicer on a real in-process gRPC server, driven through the generated stubs.

Servers bind 127.0.0.1 port 0 (the OS picks the port) and are stopped in teardown.
The rollout and learner load the session's tiny random model (tests/conftest.py).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from rlfleet.config import LearnerConfig
from rlfleet.proto.v1 import (
    common_pb2,
    learner_pb2,
    learner_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from rlfleet.rpc.channel import open_channel
from rlfleet.rpc.server import ServiceServer
from services.learner.learner import Learner
from services.learner.servicer import SERVICE_NAME as LEARNER_SERVICE
from services.learner.servicer import LearnerServicer
from services.reward.scorer import RewardScorer
from services.reward.servicer import SERVICE_NAME as REWARD_SERVICE
from services.reward.servicer import RewardServicer
from services.rollout.engines.hf import HFEngine
from services.rollout.servicer import SERVICE_NAME as ROLLOUT_SERVICE
from services.rollout.servicer import RolloutServicer

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

TIMEOUT = 30  # seconds, per RPC
CPU = torch.device("cpu")


@dataclass
class Running:
    server: ServiceServer
    channel: grpc.Channel
    servicer: object
    service_name: str

    def health(self, service: str = "") -> int:
        return health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT).status


@dataclass(frozen=True)
class Role:
    servicer_cls: type
    add_fn: Callable
    stub_cls: type
    service_name: str


ROLES = {
    "reward": Role(RewardServicer, reward_pb2_grpc.add_RewardServicer_to_server, reward_pb2_grpc.RewardStub,
                   REWARD_SERVICE),
    "rollout": Role(RolloutServicer, rollout_pb2_grpc.add_RolloutServicer_to_server,
                    rollout_pb2_grpc.RolloutStub, ROLLOUT_SERVICE),
    "learner": Role(LearnerServicer, learner_pb2_grpc.add_LearnerServicer_to_server,
                    learner_pb2_grpc.LearnerStub, LEARNER_SERVICE),
}


def start(role: str) -> Running:
    """Starts an unattached servicer: listening, but NOT_SERVING."""
    spec = ROLES[role]
    servicer = spec.servicer_cls()
    server = ServiceServer([spec.service_name], "127.0.0.1", 0, max_workers=4)
    server.add(spec.add_fn, servicer)
    server.start()
    return Running(server, open_channel(server.address), servicer, spec.service_name)


def stop(running: Running) -> None:
    running.channel.close()
    running.server.stop(grace_s=0)


@pytest.fixture
def started() -> Iterator[Callable[[str], Running]]:
    servers: list[Running] = []

    def _start(role: str) -> Running:
        servers.append(start(role))
        return servers[-1]

    yield _start
    for running in servers:
        stop(running)


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if isinstance(result, Iterator):
            list(result)
    return info.value.code()


def details_of(call: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if isinstance(result, Iterator):
            list(result)
    return info.value.details()


# ---- cores, loaded once per module ---------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir: Path) -> HFEngine:
    return HFEngine(tiny_model_dir, CPU, torch.float32, max_batch_sequences=4)


@pytest.fixture(scope="module")
def learner_cfg() -> LearnerConfig:
    return LearnerConfig(lr=1e-3, micro_batch_tokens=16)


def make_learner(tiny_model_dir: Path, cfg: LearnerConfig, checkpoint_dir: Path) -> Learner:
    return Learner(cfg, tiny_model_dir, CPU, torch.float32, checkpoint_dir, seed=0)


def attach(role: str, running: Running, core: object) -> None:
    if role == "rollout":
        running.servicer.attach(core)
    else:
        running.servicer.attach(core)
    running.server.mark_serving()


@pytest.fixture(scope="module")
def reward_server() -> Iterator[Running]:
    running = start("reward")
    attach("reward", running, RewardScorer("tests.reward_fixtures:score"))
    yield running
    stop(running)


@pytest.fixture(scope="module")
def auto_reward_server() -> Iterator[Running]:
    running = start("reward")
    attach("reward", running, RewardScorer("auto"))
    yield running
    stop(running)


@pytest.fixture(scope="module")
def rollout_server(hf_engine: HFEngine) -> Iterator[Running]:
    running = start("rollout")
    attach("rollout", running, hf_engine)
    yield running
    stop(running)


@pytest.fixture
def learner_server(tiny_model_dir: Path, learner_cfg: LearnerConfig, tmp_path: Path) -> Iterator[Running]:
    """A fresh learner (policy version 0) per test."""
    running = start("learner")
    attach("learner", running, make_learner(tiny_model_dir, learner_cfg, tmp_path / "checkpoints"))
    yield running
    stop(running)


# ---- (a) health and readiness -------------------------------------------------------------------

def call_before_attach(role: str, stub: object) -> Callable[[], object]:
    if role == "reward":
        return lambda: stub.Score(reward_pb2.ScoreRequest(items=[reward_pb2.ScoreItem(id="a")]), timeout=TIMEOUT)
    if role == "rollout":
        return lambda: stub.Generate(rollout_pb2.GenerateRequest(
            prompts=[rollout_pb2.PromptInput(request_id="a", prompt_ids=[5, 6])],
            params=common_pb2.SamplingParams(n=2, max_new_tokens=2)), timeout=TIMEOUT)
    return lambda: stub.Train(learner_pb2.TrainRequest(step=1, expected_version=-1, samples=[
        learner_pb2.TrainSample(prompt_ids=[5], response_ids=[6], behaviour_logprobs=[-1.0])]), timeout=TIMEOUT)


@pytest.mark.parametrize("role", ["reward", "rollout", "learner"])
def test_not_serving_until_attached(role, started, request):
    running = started(role)
    stub = ROLES[role].stub_cls(running.channel)
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    assert running.health() == not_serving
    assert running.health(running.service_name) == not_serving
    assert code_of(call_before_attach(role, stub)) == grpc.StatusCode.UNAVAILABLE
    status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
    assert status.role == role and not status.ready
    assert "NotReady" in status.last_error  # the refusal is remembered for `rlfleet status`

    if role == "reward":
        core = RewardScorer("tests.reward_fixtures:score")
    elif role == "rollout":
        core = request.getfixturevalue("hf_engine")
    else:
        core = make_learner(request.getfixturevalue("tiny_model_dir"), request.getfixturevalue("learner_cfg"),
                            request.getfixturevalue("tmp_path") / "ckpt")
    attach(role, running, core)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert running.health() == serving
    assert running.health(running.service_name) == serving
    assert stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).ready


def test_stopped_server_refuses_work(started):
    running = started("reward")
    attach("reward", running, RewardScorer("tests.reward_fixtures:score"))
    assert running.health() == health_pb2.HealthCheckResponse.SERVING
    running.server.stop(grace_s=0)
    running.server.stop(grace_s=0)  # idempotent
    stub = reward_pb2_grpc.RewardStub(running.channel)
    assert code_of(lambda: stub.GetStatus(common_pb2.GetStatusRequest(), timeout=2)) \
        == grpc.StatusCode.UNAVAILABLE


# ---- (b) reward ---------------------------------------------------------------------------------

def item(i: str, response: str, truth: str, source: str = "custom", extra: dict | None = None,
         extra_json: str | None = None) -> reward_pb2.ScoreItem:
    return reward_pb2.ScoreItem(id=i, data_source=source, prompt="p", response=response, ground_truth=truth,
                                extra_info_json=extra_json if extra_json is not None else
                                (json.dumps(extra) if extra else ""))


def test_reward_scores_one_result_per_item(reward_server):
    stub = reward_pb2_grpc.RewardStub(reward_server.channel)
    reply = stub.Score(reward_pb2.ScoreRequest(items=[
        item("a", "42", "42"), item("b", "41", "42"), item("c", " 7 ", "7", extra={"bonus": 0.5}),
        item("d", "x", "dict")]), timeout=TIMEOUT)
    assert [r.id for r in reply.results] == ["a", "b", "c", "d"]
    assert [r.ok for r in reply.results] == [True] * 4
    assert [r.score for r in reply.results] == pytest.approx([1.0, 0.0, 1.5, 0.25])
    assert all(r.error == "" for r in reply.results)


def test_reward_failures_are_reported_not_scored_zero(reward_server):
    stub = reward_pb2_grpc.RewardStub(reward_server.channel)
    reply = stub.Score(reward_pb2.ScoreRequest(items=[
        item("ok", "1", "1"), item("boom", "1", "raise"), item("nan", "1", "nan"), item("inf", "1", "inf")]),
        timeout=TIMEOUT)
    by_id = {r.id: r for r in reply.results}
    assert by_id["ok"].ok and by_id["ok"].score == 1.0
    for bad in ("boom", "nan", "inf"):
        assert not by_id[bad].ok, bad
        assert by_id[bad].error, bad
    assert "exploded" in by_id["boom"].error and "ValueError" in by_id["boom"].error
    assert "nan" in by_id["nan"].error.lower()


def test_reward_bad_requests_and_recovery(reward_server, auto_reward_server):
    stub = reward_pb2_grpc.RewardStub(reward_server.channel)
    not_json = reward_pb2.ScoreRequest(items=[item("a", "1", "1", extra_json="{not json")])
    assert code_of(lambda: stub.Score(not_json, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    assert "extra_info_json" in details_of(lambda: stub.Score(not_json, timeout=TIMEOUT))
    not_object = reward_pb2.ScoreRequest(items=[item("a", "1", "1", extra_json="[1, 2]")])
    assert code_of(lambda: stub.Score(not_object, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    duplicate = reward_pb2.ScoreRequest(items=[item("a", "1", "1"), item("a", "2", "2")])
    assert code_of(lambda: stub.Score(duplicate, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT

    auto = reward_pb2_grpc.RewardStub(auto_reward_server.channel)
    unknown = reward_pb2.ScoreRequest(items=[item("a", "1", "1", source="no/such_source")])
    assert code_of(lambda: auto.Score(unknown, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    assert "no/such_source" in details_of(lambda: auto.Score(unknown, timeout=TIMEOUT))

    # Both servers still answer, and remember the last error for GetStatus.
    reply = stub.Score(reward_pb2.ScoreRequest(items=[item("z", "3", "3")]), timeout=TIMEOUT)
    assert reply.results[0].ok and reply.results[0].score == 1.0
    status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
    assert status.ready and "InvalidRequest" in status.last_error
    assert auto.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).ready
    assert auto_reward_server.health() == health_pb2.HealthCheckResponse.SERVING


def test_reward_empty_request(reward_server):
    stub = reward_pb2_grpc.RewardStub(reward_server.channel)
    assert list(stub.Score(reward_pb2.ScoreRequest(), timeout=TIMEOUT).results) == []


# ---- (c) rollout --------------------------------------------------------------------------------

def generate(stub, prompts: dict[str, list[int]], **params) -> list[rollout_pb2.GroupResult]:
    request = rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.PromptInput(request_id=rid, prompt_ids=ids) for rid, ids in prompts.items()],
        params=common_pb2.SamplingParams(**params))
    return list(stub.Generate(request, timeout=TIMEOUT))


PROMPTS = {"p0": [6, 7, 41, 8, 45], "p1": [15, 16], "p2": [9, 10, 11, 12, 13, 14, 20]}


def test_rollout_generate_streams_groups(rollout_server, hf_engine):
    stub = rollout_pb2_grpc.RolloutStub(rollout_server.channel)
    # max_batch_sequences=4 with n=3: one group per chunk, so the stream has three chunks.
    groups = generate(stub, PROMPTS, n=3, temperature=1.0, top_p=1.0, max_new_tokens=6, seed=1)
    assert sorted(g.request_id for g in groups) == sorted(PROMPTS)
    for g in groups:
        assert len(g.completions) == 3
        for c in g.completions:
            assert 1 <= len(c.token_ids) <= 6
            assert len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert all(math.isfinite(lp) for lp in c.logprobs)
            assert c.policy_version == 0
            assert c.finish_reason in {"stop", "length"}
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in hf_engine.eos_ids
            else:
                assert len(c.token_ids) == 6 and not set(c.token_ids) & set(hf_engine.eos_ids)
            assert all(0 <= t < hf_engine.vocab_size for t in c.token_ids)


@pytest.mark.parametrize("max_new_tokens", [1, 3])
def test_rollout_respects_max_new_tokens(rollout_server, max_new_tokens):
    stub = rollout_pb2_grpc.RolloutStub(rollout_server.channel)
    groups = generate(stub, {"a": [6, 7], "b": [8]}, n=2, temperature=1.0, max_new_tokens=max_new_tokens, seed=2)
    lengths = [len(c.token_ids) for g in groups for c in g.completions]
    assert len(lengths) == 4 and all(1 <= n <= max_new_tokens for n in lengths)


def test_rollout_logprobs_match_the_model(rollout_server, hf_engine):
    """The sampling logprobs are the policy's own: recompute them with a plain forward pass,
    for prompts of different lengths batched together (left padding must not change them)."""
    stub = rollout_pb2_grpc.RolloutStub(rollout_server.channel)
    temperature = 0.7
    groups = generate(stub, {"short": [15], "long": [6, 7, 41, 8, 45, 9, 10]}, n=2, temperature=temperature,
                      max_new_tokens=5, seed=3)
    prompts = {"short": [15], "long": [6, 7, 41, 8, 45, 9, 10]}
    model = hf_engine.model
    for g in groups:
        prompt = prompts[g.request_id]
        for c in g.completions:
            ids = torch.tensor([prompt + list(c.token_ids)])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
            expected = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(list(c.logprobs)), expected, atol=2e-4, rtol=1e-4)


def test_rollout_greedy_is_deterministic(rollout_server):
    stub = rollout_pb2_grpc.RolloutStub(rollout_server.channel)
    first = generate(stub, {"a": [6, 7, 8]}, n=3, temperature=0.0, max_new_tokens=4)
    again = generate(stub, {"a": [6, 7, 8]}, n=3, temperature=0.0, max_new_tokens=4)
    seqs = [list(c.token_ids) for c in first[0].completions]
    assert seqs[0] == seqs[1] == seqs[2]
    assert seqs[0] == list(again[0].completions[0].token_ids)


def test_rollout_rejects_bad_requests_and_keeps_serving(rollout_server):
    stub = rollout_pb2_grpc.RolloutStub(rollout_server.channel)
    cases = {
        "out of vocab": ({"a": [5, 64]}, grpc.StatusCode.INVALID_ARGUMENT),
        "negative id": ({"a": [-1]}, grpc.StatusCode.INVALID_ARGUMENT),
        "empty prompt": ({"a": []}, grpc.StatusCode.INVALID_ARGUMENT),
        "too long": ({"a": [5] * 127}, grpc.StatusCode.RESOURCE_EXHAUSTED),  # 127 + 4 > 128 positions
    }
    for name, (prompts, code) in cases.items():
        assert code_of(lambda p=prompts: generate(stub, p, n=2, temperature=1.0, max_new_tokens=4)) == code, name
    assert code_of(lambda: generate(stub, {}, n=2, max_new_tokens=4)) == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside [0, 64)" in details_of(lambda: generate(stub, {"a": [64]}, n=2, max_new_tokens=2))
    # Still serving.
    assert len(generate(stub, {"ok": [6]}, n=2, temperature=1.0, max_new_tokens=2)) == 1
    status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
    assert status.ready and status.in_flight == 0 and "InvalidRequest" in status.last_error


def test_rollout_stop_strings_end_the_completion(rollout_server, hf_engine):
    stub = rollout_pb2_grpc.RolloutStub(rollout_server.channel)
    stops = list("abcdev")
    groups = generate(stub, {f"p{i}": [6 + i] for i in range(4)}, n=4, temperature=1.0, max_new_tokens=12,
                      seed=0, stop=stops)
    by_stop_string = [c for g in groups for c in g.completions
                      if c.finish_reason == "stop" and c.token_ids[-1] not in hf_engine.eos_ids]
    if not by_stop_string:
        pytest.skip("no completion hit a stop string with this model and seed")
    decode = hf_engine.tokenizer.decode
    for c in by_stop_string:
        # The stop string appears with the last token, not before (no padding after it).
        assert any(s in decode(list(c.token_ids), skip_special_tokens=True) for s in stops)
        assert not any(s in decode(list(c.token_ids)[:-1], skip_special_tokens=True) for s in stops)


def test_rollout_cancelled_stream_is_not_left_in_flight(started, hf_engine):
    import time

    running = started("rollout")
    attach("rollout", running, hf_engine)
    stub = rollout_pb2_grpc.RolloutStub(running.channel)
    request = rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.PromptInput(request_id=str(i), prompt_ids=[6]) for i in range(12)],
        params=common_pb2.SamplingParams(n=2, temperature=1.0, max_new_tokens=8))
    call = stub.Generate(request, timeout=TIMEOUT)
    next(call)
    call.cancel()
    deadline = time.monotonic() + 3
    in_flight = -1
    while time.monotonic() < deadline:
        in_flight = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).in_flight
        if in_flight == 0:
            break
        time.sleep(0.1)
    assert in_flight == 0


# ---- (d) learner --------------------------------------------------------------------------------

def train_request(step: int = 1, expected_version: int = -1, logprobs: list[float] | None = None
                  ) -> learner_pb2.TrainRequest:
    samples = [
        learner_pb2.TrainSample(prompt_ids=[6, 7, 41, 8, 45], response_ids=[9, 2],
                                behaviour_logprobs=logprobs if logprobs is not None else [-4.0, -4.2],
                                advantage=1.0, generation_version=0),
        learner_pb2.TrainSample(prompt_ids=[6, 7, 41, 8, 45], response_ids=[10, 11, 2],
                                behaviour_logprobs=[-4.1, -4.0, -4.3], advantage=-1.0, generation_version=0),
        learner_pb2.TrainSample(prompt_ids=[15, 16], response_ids=[20, 21, 22, 2],
                                behaviour_logprobs=[-4.0] * 4, advantage=0.5, generation_version=0),
    ]
    return learner_pb2.TrainRequest(step=step, samples=samples, temperature=1.0, expected_version=expected_version)


def test_learner_train_step(learner_server):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    before = {n: p.detach().clone() for n, p in learner_server.servicer.learner.model.named_parameters()}
    reply = stub.Train(train_request(step=1, expected_version=0), timeout=TIMEOUT)
    assert reply.policy_version == 1
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/kl_loss", "actor/lr"):
        assert key in reply.metrics, key
        assert math.isfinite(reply.metrics[key]), key
    assert reply.metrics["actor/grad_norm"] > 0
    assert reply.metrics["actor/entropy"] > 0
    assert reply.metrics["learner/tokens"] == 9
    # micro_batch_tokens=16 splits the 3 samples (lengths 7, 8, 6) into several micro-batches.
    assert reply.metrics["learner/micro_batches"] >= 2
    after = dict(learner_server.servicer.learner.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)  # the optimizer stepped

    reply = stub.Train(train_request(step=2, expected_version=1), timeout=TIMEOUT)
    assert reply.policy_version == 2
    status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
    assert status.ready and status.policy_version == 2 and status.stats["step"] == 2


def test_learner_version_mismatch(learner_server):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    assert code_of(lambda: stub.Train(train_request(expected_version=3), timeout=TIMEOUT)) \
        == grpc.StatusCode.FAILED_PRECONDITION
    assert "expected policy version 3" in details_of(
        lambda: stub.Train(train_request(expected_version=3), timeout=TIMEOUT))
    # The refused step did not count.
    assert stub.Train(train_request(expected_version=0), timeout=TIMEOUT).policy_version == 1


def test_learner_rejects_bad_samples(learner_server):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    mismatched = train_request(logprobs=[-1.0])  # 1 logprob for 2 response tokens
    assert code_of(lambda: stub.Train(mismatched, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    assert "behaviour_logprobs" in details_of(lambda: stub.Train(mismatched, timeout=TIMEOUT))
    empty = learner_pb2.TrainRequest(step=1, expected_version=-1)
    assert code_of(lambda: stub.Train(empty, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    too_long = learner_pb2.TrainRequest(step=1, expected_version=-1, samples=[learner_pb2.TrainSample(
        prompt_ids=[5] * 120, response_ids=[6] * 10, behaviour_logprobs=[-1.0] * 10, advantage=1.0)])
    assert code_of(lambda: stub.Train(too_long, timeout=TIMEOUT)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).policy_version == 0


def test_learner_save_checkpoint(learner_server, tmp_path):
    stub = learner_pb2_grpc.LearnerStub(learner_server.channel)
    stub.Train(train_request(step=1, expected_version=0), timeout=TIMEOUT)
    path = Path(stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(step=1), timeout=TIMEOUT).path)
    assert path.is_dir() and path.name == "step_1"
    for name in ("config.json", "model.safetensors", "optimizer.pt", "meta.json"):
        assert (path / name).is_file(), name
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 1 and meta["policy_version"] == 1
    assert not list(path.parent.glob("*.tmp-*"))  # nothing half-written left behind


def test_rollout_logprobs_agree_with_learner(rollout_server, learner_server):
    """Same weights on both sides: the learner's logprobs of a rollout's samples equal the
    behaviour logprobs, so the first step is on-policy (importance ratio 1)."""
    rollout = rollout_pb2_grpc.RolloutStub(rollout_server.channel)
    prompts = {"a": [6, 7, 41, 8, 45], "b": [15, 16]}
    groups = generate(rollout, prompts, n=2, temperature=1.0, max_new_tokens=5, seed=4)
    samples = [learner_pb2.TrainSample(prompt_ids=prompts[g.request_id], response_ids=c.token_ids,
                                       behaviour_logprobs=c.logprobs, advantage=1.0 if i % 2 else -1.0,
                                       generation_version=c.policy_version)
               for g in groups for i, c in enumerate(g.completions)]
    learner = learner_pb2_grpc.LearnerStub(learner_server.channel)
    reply = learner.Train(learner_pb2.TrainRequest(step=1, samples=samples, temperature=1.0, expected_version=0),
                          timeout=TIMEOUT)
    assert reply.metrics["rollout/logprob_diff_mean"] < 1e-3
    assert reply.metrics["actor/pg_clipfrac"] == 0.0


# ---- (e) reflection and (f) status ---------------------------------------------------------------

def test_reflection_lists_the_services(reward_server, rollout_server, learner_server):
    for running in (reward_server, rollout_server, learner_server):
        services = ProtoReflectionDescriptorDatabase(running.channel).get_services()
        assert running.service_name in services
        assert "grpc.health.v1.Health" in services
    assert {REWARD_SERVICE, ROLLOUT_SERVICE, LEARNER_SERVICE} == {
        "rlfleet.v1.Reward", "rlfleet.v1.Rollout", "rlfleet.v1.Learner"}


def test_get_status_reports_ready(reward_server, rollout_server, learner_server):
    stubs = {"reward": reward_pb2_grpc.RewardStub(reward_server.channel),
             "rollout": rollout_pb2_grpc.RolloutStub(rollout_server.channel),
             "learner": learner_pb2_grpc.LearnerStub(learner_server.channel)}
    for role, stub in stubs.items():
        status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
        assert status.role == role
        assert status.ready, role
        assert status.in_flight == 0, role
        assert status.policy_version >= 0
