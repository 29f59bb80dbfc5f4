"""The rollout servicer (HF engine) on a real in-process gRPC server.

Servers bind 127.0.0.1 port 0 (the OS picks the port) and are stopped in teardown.
The rollout and learner load the session's tiny random model (tests/conftest.py).
"""
from __future__ import annotations

import math

import grpc
import pytest
import torch

from rlfleet.proto.v1 import (
    common_pb2,
    rollout_pb2,
    rollout_pb2_grpc,
)
from tests.service.servicer_harness import (
    PROMPTS,
    TIMEOUT,
    attach,
    code_of,
    details_of,
    generate,
)

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


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
    groups = generate(stub, {"a": [6, 7], "b": [8]}, n=2, temperature=1.0,
                      max_new_tokens=max_new_tokens, seed=2)
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
        assert code_of(lambda p=prompts: generate(stub, p, n=2, temperature=1.0,
                                                  max_new_tokens=4)) == code, name
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
    deadline = time.monotonic() + 30  # ms idle; a leak never gets there
    in_flight = -1
    while time.monotonic() < deadline:
        in_flight = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT).in_flight
        if in_flight == 0:
            break
        time.sleep(0.1)
    assert in_flight == 0


# ---- (d) learner --------------------------------------------------------------------------------
