"""A recorded real episode (tests/assets/calculator_episode_tiny.json: the embedded tiny model, after SFT on
calculator traces, calling the calculator server through the agent loop; how it was recorded is in the
file) carries the right loss mask into the learner: the tool result and the template's text around it
have mask 0 and logprob 0, and the learner's token mean counts the model's tokens only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlfleet.types import TrainBatch, TrainSample

pytestmark = pytest.mark.unit
EPISODE = json.loads((Path(__file__).parents[1] / "assets" / "calculator_episode_tiny.json").read_text())
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "15 * 5"}}</tool_call>'
SHOWN = "<|im_end|>\n<|im_start|>tool\n75<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoTokenizer

    from rlfleet.models.tiny import ensure_tiny_model

    path = ensure_tiny_model()  # the recorded model's tokenizer and architecture (its weights differ)
    return path, AutoTokenizer.from_pretrained(path)


def test_the_tool_result_of_a_recorded_episode_has_mask_0(tiny):
    _, tok = tiny
    ids, mask, logprobs = EPISODE["token_ids"], EPISODE["loss_mask"], EPISODE["logprobs"]
    assert len(ids) == len(mask) == len(logprobs)
    first, answer = EPISODE["turns"]
    # the model stopped at its call (rollout.stop); the closing <|im_end|>, the tool message and the next
    # generation prompt are the observation: context only
    assert first["text"] == CALL and first["tool_calls"] == 1 and first["observation"] == SHOWN
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == CALL + answer["text"] + "<|im_end|>"
    assert tok.decode([t for t, m in zip(ids, mask) if not m]) == SHOWN
    assert mask == ([1] * first["generated_tokens"] + [0] * first["observed_tokens"]
                    + [1] * answer["generated_tokens"])
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)
    assert all(lp < 0.0 for lp, m in zip(logprobs, mask) if m == 1)  # sampled tokens' own logprobs


@pytest.mark.parametrize("packed", [False, True])
def test_the_learner_token_mean_leaves_the_tool_tokens_out(tiny, tmp_path, packed):
    """Under the `nll` loss (advantage 1, token mean) the learner's loss is the mean over the model's
    tokens only: computed here by hand from the model's log-probs with the tool tokens left out, and not
    moved by garbage behaviour log-probs at the tool tokens."""
    from transformers import AutoModelForCausalLM

    from rlfleet.app.sft_trainer import SFT_ALGORITHM
    from rlfleet.config import LearnerConfig
    from services.learner.learner import Learner

    path, _ = tiny
    prompt, ids, mask = EPISODE["prompt_ids"], EPISODE["token_ids"], EPISODE["loss_mask"]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
    token_logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
    trained = torch.tensor(mask, dtype=torch.bool)
    by_hand = -token_logp[trained].mean().item()  # 102 model tokens; the 15 tool tokens left out
    everything = -token_logp.mean().item()
    assert by_hand != pytest.approx(everything, rel=1e-3)  # the mask matters for this episode

    def step(observation_logprob: float) -> dict:
        logprobs = [lp if m else observation_logprob for lp, m in zip(EPISODE["logprobs"], mask)]
        learner = Learner(LearnerConfig(lr=1e-3, pack_sequences=packed), path, torch.device("cpu"),
                          torch.float32, tmp_path / "ckpt", algorithm=SFT_ALGORITHM)
        sample = TrainSample(prompt, ids, logprobs, advantage=1.0, generation_version=0, loss_mask=mask)
        return learner.train(TrainBatch(step=1, samples=[sample])).metrics

    metrics = step(0.0)
    assert metrics["actor/pg_loss"] == pytest.approx(by_hand, rel=1e-5)
    assert metrics["learner/trained_tokens"] == sum(mask) == 102  # the token mean's count
    assert metrics["learner/tokens"] == len(ids) == 117  # processed: the tool tokens are context
    garbage = step(-50.0)
    assert garbage["actor/pg_loss"] == pytest.approx(metrics["actor/pg_loss"], rel=1e-6)
    assert garbage["actor/grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-6)
