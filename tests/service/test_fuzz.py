"""Fuzzing each service with generated malformed requests; it must refuse them cleanly and keep serving.

Each of the rollout, reward and learner services (in-process, loopback, the tiny random model)
gets FUZZ_PER_SERVICE requests spread over all its RPCs, sent as raw bytes through a generic
`channel.unary_unary` / `unary_stream` with identity serializers:

- messages of the method's request type with random field values drawn from edge cases
  (0, -1, int extremes, NaN, inf, empty and oversized strings, ids outside the vocabulary, …),
- random bytes,
- valid encodings with bytes flipped, cut or inserted,
- a few messages larger than the configured message limit.

Every answer must be OK or a deliberate refusal (INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
FAILED_PRECONDITION, UNAVAILABLE for "no weight group yet", ABORTED for a weight sync with nobody
there). INTERNAL or UNKNOWN would be an unhandled exception in the service: a bug. Afterwards each
service still says SERVING and answers a valid request. Seeded, so a failure replays.
"""
from __future__ import annotations

import math
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from google.protobuf import descriptor_pool, symbol_database
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.config import LearnerConfig
from rlfleet.proto.v1 import common_pb2, learner_pb2, reward_pb2, rollout_pb2
from rlfleet.rpc.security import Security, secure_channel
from rlfleet.rpc.server import ServiceServer
from rlfleet.security_config import LimitsConfig
from services.learner.learner import Learner
from services.reward.scorer import RewardScorer
from services.rollout.engines.hf import HFEngine
from tests.service.servicer_harness import ROLES

pytestmark = [pytest.mark.service, pytest.mark.timeout(150)]

SEED = int(os.environ.get("RLFLEET_FUZZ_SEED", "7"))  # set it to fuzz other cases
FUZZ_PER_SERVICE = 1000
TIME_BUDGET_S = 40.0  # per service; the test fails if fuzzing takes longer (a hang is a finding too)
MESSAGE_LIMIT = 64 * 1024
LIMITS = LimitsConfig(max_message_mb=1, max_prompts_per_request=4, max_samples_per_prompt=4,
                      max_sequences_per_request=8, max_train_samples=8, max_score_items=16,
                      max_text_chars=512,
                      max_weight_timeout_s=0.5, max_world_size=4)
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED}

INTS = [0, 1, -1, 2, 3, 4, 5, 7, 63, 64, 127, 128, 1000, 2**31 - 1, -2**31]
INT64S = [*INTS, 2**63 - 1, -2**63, 2**40]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 1e30, -1e30, 3.4e38, math.nan, math.inf, -math.inf, 1e-3, 7.0]
STRINGS = ["", "a", "p0", "gloo", "nccl", "mpi", "127.0.0.1:1", "127.0.0.1:0", "127.0.0.1:99999", "[::1]:1",
           "host:port", ":", "custom", "digits", "gsm8k", "no/such_source", "raise", "nan", "inf", "42",
           "{", "[1, 2]", '{"bonus": 0.5}', '{"a": ' * 200, "\x00\xff", "é" * 3, "x" * 600]


def _value(field: FieldDescriptor, rng: random.Random, depth: int):
    t = field.type
    if t == FieldDescriptor.TYPE_MESSAGE:
        return random_message(field.message_type._concrete_class, rng, depth + 1)
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return rng.choice(INTS) if rng.random() < 0.8 else rng.randint(-100, 100)
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return rng.choice(INT64S) if rng.random() < 0.8 else rng.randint(-100, 100)
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return rng.choice([0, 1, 2**32 - 1])
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return rng.choice([0, 1, 2**64 - 1])
    if t == FieldDescriptor.TYPE_FLOAT:
        return rng.choice(FLOATS) if rng.random() < 0.8 else rng.uniform(-5, 1)
    if t == FieldDescriptor.TYPE_DOUBLE:
        return rng.choice([*FLOATS, 1e300]) if rng.random() < 0.8 else rng.uniform(-5, 5)
    if t == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if t == FieldDescriptor.TYPE_STRING:
        return rng.choice(STRINGS)
    if t == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.randint(0, 16))
    if t == FieldDescriptor.TYPE_ENUM:
        return rng.choice([v.number for v in field.enum_type.values])
    raise AssertionError(f"unhandled field type {t}")


def random_message(cls: type, rng: random.Random, depth: int = 0):
    msg = cls()
    if depth > 3:
        return msg
    for field in cls.DESCRIPTOR.fields:
        if rng.random() < 0.25:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue
        if field.is_repeated:
            getattr(msg, field.name).extend(_value(field, rng, depth)
                                            for _ in range(rng.choice([0, 1, 2, 3, 5, 9])))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(msg, field.name).CopyFrom(_value(field, rng, depth))
        else:
            setattr(msg, field.name, _value(field, rng, depth))
    return msg


def mutate(payload: bytes, rng: random.Random) -> bytes:
    data = bytearray(payload or b"\x00")
    for _ in range(rng.randint(1, 4)):
        op, i = rng.random(), rng.randrange(len(data))
        if op < 0.4:
            data[i] ^= 1 << rng.randrange(8)
        elif op < 0.7:
            del data[i:i + rng.randint(1, 4)]
            data = data or bytearray(b"\x08")
        else:
            data[i:i] = rng.randbytes(rng.randint(1, 4))
    return bytes(data)


def valid_requests() -> dict[str, object]:
    """One well-formed request per method, the seeds of the mutations and the final check."""
    return {
        "Generate": rollout_pb2.GenerateRequest(
            prompts=[rollout_pb2.PromptInput(request_id="ok", prompt_ids=[6, 7, 8])],
            params=common_pb2.SamplingParams(n=2, temperature=1.0, max_new_tokens=2)),
        "JoinWeightGroup": rollout_pb2.JoinWeightGroupRequest(address="127.0.0.1:1", rank=1, world_size=2,
                                                              backend="gloo", timeout_s=0.2),
        "PullWeights": rollout_pb2.PullWeightsRequest(version=1),
        "GetStatus": common_pb2.GetStatusRequest(),
        "Score": reward_pb2.ScoreRequest(items=[
            reward_pb2.ScoreItem(id="a", data_source="custom", response="4", ground_truth="4")]),
        "Train": learner_pb2.TrainRequest(step=1, temperature=1.0, expected_version=0, samples=[
            learner_pb2.TrainSample(prompt_ids=[6, 7], response_ids=[9, 2], behaviour_logprobs=[-4.0, -4.0],
                                    advantage=1.0)]),
        "OpenWeightGroup": learner_pb2.OpenWeightGroupRequest(world_size=2, timeout_s=0.2),
        "PushWeights": learner_pb2.PushWeightsRequest(version=10**6),
        # a group this learner does not hold: a no-op (an abort of the run's group is tested elsewhere)
        "AbortWeightGroup": learner_pb2.AbortWeightGroupRequest(group="127.0.0.1:1", reason="fuzz"),
        "SaveCheckpoint": learner_pb2.SaveCheckpointRequest(step=-1),
        "ListCheckpoints": learner_pb2.ListCheckpointsRequest(),
    }


# ---- the three services ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    cores = {
        "rollout": HFEngine(tiny_model_dir, torch.device("cpu"), torch.float32, max_batch_sequences=8),
        "reward": RewardScorer("tests.reward_fixtures:score"),
        "learner": Learner(LearnerConfig(lr=1e-3), tiny_model_dir, torch.device("cpu"), torch.float32,
                           tmp_path_factory.mktemp("fuzz_ckpt"), seed=0),
    }
    security = Security(max_message_bytes=MESSAGE_LIMIT)
    running = {}
    for role, core in cores.items():
        spec = ROLES[role]
        servicer = spec.servicer_cls(limits=LIMITS)
        server = ServiceServer([spec.service_name], "127.0.0.1", 0, max_workers=4, security=security)
        server.add(spec.add_fn, servicer)
        server.start()
        servicer.attach(core)
        server.mark_serving()
        running[role] = (server, servicer)
    yield running
    for server, _ in running.values():
        server.stop(grace_s=0)


def _methods(service_name: str) -> list[tuple[str, str, bool, type]]:
    service = descriptor_pool.Default().FindServiceByName(service_name)
    db = symbol_database.Default()
    return [(m.name, f"/{service_name}/{m.name}", m.server_streaming, db.GetSymbol(m.input_type.full_name))
            for m in service.methods]


def _send(channel: grpc.Channel, path: str, streaming: bool, payload: bytes) -> grpc.StatusCode:
    try:
        if streaming:
            for _ in channel.unary_stream(path)(payload, timeout=20):
                pass
        else:
            channel.unary_unary(path)(payload, timeout=20)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("role", ["rollout", "reward", "learner"])
def test_fuzzed_requests_are_refused_and_the_service_keeps_serving(fuzz_servers, role):
    server, _ = fuzz_servers[role]
    rng = random.Random(f"{SEED}-{role}")
    methods = _methods(ROLES[role].service_name)
    seeds = valid_requests()
    codes: Counter = Counter()
    bad: list[str] = []
    started = time.monotonic()
    with secure_channel(server.address, Security(max_message_bytes=4 * MESSAGE_LIMIT)) as channel:
        for i in range(FUZZ_PER_SERVICE):
            name, path, streaming, cls = rng.choice(methods)
            if name == "SaveCheckpoint" and rng.random() < 0.9:  # a valid save writes files: keep them few
                name, path, streaming, cls = rng.choice([m for m in methods if m[0] != "SaveCheckpoint"])
            kind = rng.random()
            if i % 100 == 99:
                payload, how = rng.randbytes(MESSAGE_LIMIT + rng.randint(1, 1000)), "oversized"
            elif kind < 0.45:
                payload, how = random_message(cls, rng).SerializeToString(), "random fields"
            elif kind < 0.7:
                payload, how = rng.randbytes(rng.randint(0, 48)), "random bytes"
            else:
                payload, how = mutate(seeds[name].SerializeToString(), rng), "mutated"
            code = _send(channel, path, streaming, payload)
            codes[code.name] += 1
            if code != grpc.StatusCode.OK and code not in REFUSALS:
                bad.append(f"#{i} {name} ({how}, {payload[:80]!r}): {code.name}")
            if how == "oversized" and code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                bad.append(f"#{i} {name} oversized ({len(payload)} bytes): {code.name}")
            assert time.monotonic() - started < TIME_BUDGET_S, \
                f"fuzzing {role} took too long after {i} requests"
        print(f"{role}: {dict(codes)}")
        assert not bad, f"{len(bad)} unexpected answers (seed {SEED}): " + "; ".join(bad[:10])
        assert sum(codes.values()) >= FUZZ_PER_SERVICE
        assert codes["INVALID_ARGUMENT"] > FUZZ_PER_SERVICE // 10, codes  # the fuzz did reach the checks

        # Still healthy, and a valid request is answered.
        assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status \
            == health_pb2.HealthCheckResponse.SERVING
        stub = ROLES[role].stub_cls(channel)
        if role == "rollout":
            groups = list(stub.Generate(seeds["Generate"], timeout=30))
            assert len(groups) == 1 and len(groups[0].completions) == 2
        elif role == "reward":
            assert stub.Score(seeds["Score"], timeout=30).results[0].score == 1.0
        else:
            before = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=10).policy_version
            request = learner_pb2.TrainRequest()
            request.CopyFrom(seeds["Train"])
            request.step, request.expected_version = 10**6, before  # a step the fuzz cannot have applied
            assert stub.Train(request, timeout=30).policy_version == before + 1
        assert stub.GetStatus(common_pb2.GetStatusRequest(), timeout=10).in_flight == 0


def _code(call) -> grpc.StatusCode:
    try:
        result = call()
        if isinstance(result, Iterator):
            list(result)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_named_bad_inputs_get_their_codes(fuzz_servers):
    """The cases issue 7 names, one by one, with the code each must get."""
    invalid, too_big = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED
    channels = {role: secure_channel(server.address, Security(max_message_bytes=4 * MESSAGE_LIMIT))
                for role, (server, _) in fuzz_servers.items()}
    rollout, reward, learner = (ROLES[r].stub_cls(channels[r]) for r in ("rollout", "reward", "learner"))

    def gen(ids=(6, 7), n=2, max_new_tokens=2, count=1, **params):
        return lambda: rollout.Generate(rollout_pb2.GenerateRequest(
            prompts=[rollout_pb2.PromptInput(request_id=str(i), prompt_ids=list(ids)) for i in range(count)],
            params=common_pb2.SamplingParams(n=n, max_new_tokens=max_new_tokens, **params)), timeout=30)

    def train(**sample):
        fields = {"prompt_ids": [6, 7], "response_ids": [9, 2], "behaviour_logprobs": [-4.0, -4.0],
                  "advantage": 1.0}
        fields.update(sample)
        return lambda: learner.Train(learner_pb2.TrainRequest(step=1, expected_version=0, samples=[
            learner_pb2.TrainSample(**fields)]), timeout=30)

    def join(**fields):
        request = {"address": "127.0.0.1:1", "rank": 1, "world_size": 2, "backend": "gloo", "timeout_s": 0.2}
        request.update(fields)
        return lambda: rollout.JoinWeightGroup(rollout_pb2.JoinWeightGroupRequest(**request), timeout=30)

    cases = {
        "n=0": (gen(n=0), invalid),
        "huge n": (gen(n=10**6), too_big),
        "prompts x n over the limit": (gen(n=4, count=3), too_big),
        "too many prompts": (gen(count=5), too_big),
        "max_new_tokens=0": (gen(max_new_tokens=0), invalid),
        "negative token id": (gen(ids=(6, -3)), invalid),
        "token id outside the vocabulary": (gen(ids=(6, 64)), invalid),
        "NaN temperature": (gen(temperature=math.nan), invalid),
        "top_p > 1": (gen(top_p=1.5), invalid),
        "Train without samples": (lambda: learner.Train(learner_pb2.TrainRequest(step=1), timeout=30),
                                  invalid),
        "mismatched logprob count": (train(behaviour_logprobs=[-1.0]), invalid),
        "NaN advantage": (train(advantage=math.nan), invalid),
        "inf logprob": (train(behaviour_logprobs=[-1.0, -math.inf]), invalid),
        "response id outside the vocabulary": (train(response_ids=[9, 99]), invalid),
        "duplicate Score ids": (lambda: reward.Score(reward_pb2.ScoreRequest(items=[
            reward_pb2.ScoreItem(id="a"), reward_pb2.ScoreItem(id="a")]), timeout=30), invalid),
        "too many Score items": (lambda: reward.Score(reward_pb2.ScoreRequest(items=[
            reward_pb2.ScoreItem(id=str(i)) for i in range(17)]), timeout=30), too_big),
        "rank >= world_size": (join(rank=2), invalid),
        "rank 0 (the learner's)": (join(rank=0), invalid),
        "bad backend": (join(backend="mpi"), invalid),
        "world_size over the limit": (join(world_size=5), invalid),
        "bad address": (join(address="no-port"), invalid),
        "PullWeights "
        "negative version": (lambda: rollout.PullWeights(rollout_pb2.PullWeightsRequest(version=-1),
                                                                     timeout=30), invalid),
        "PushWeights "
        "negative version": (lambda: learner.PushWeights(learner_pb2.PushWeightsRequest(version=-1),
                                                                     timeout=30), invalid),
        "OpenWeightGroup world_size 1": (lambda: learner.OpenWeightGroup(learner_pb2.OpenWeightGroupRequest(
            world_size=1), timeout=30), invalid),
        "message over the limit": (lambda: reward.Score(reward_pb2.ScoreRequest(items=[reward_pb2.ScoreItem(
            id="a", response="x" * (MESSAGE_LIMIT + 10))]), timeout=30), too_big),
    }
    try:
        got = {name: _code(call) for name, (call, _) in cases.items()}
        assert got == {name: code for name, (_, code) in cases.items()}
        # A weight push of a version the learner does not hold, once a group is open.
        learner.OpenWeightGroup(learner_pb2.OpenWeightGroupRequest(world_size=2, timeout_s=0.2), timeout=30)
        assert _code(lambda: learner.PushWeights(learner_pb2.PushWeightsRequest(version=10**6), timeout=30)) \
            == grpc.StatusCode.FAILED_PRECONDITION
        assert len(list(gen()())) == 1  # still serving
    finally:
        for channel in channels.values():
            channel.close()
