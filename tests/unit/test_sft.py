"""`rlfleet sft` pieces: examples as the rollout sees them, the batch order, the nll loss by hand, and the
learner's SFT step equal to the plain response-only cross-entropy (padded and packed)."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlfleet.data import sft
from rlfleet.data.prompts import render_prompt
from rlfleet.errors import DataError
from services.learner.algorithms.policy_losses import ClipSettings, nll

pytestmark = pytest.mark.unit

ROWS = [
    {"data_source": "t", "prompt": [{"role": "user", "content": "Reverse the digits: 123"}],
     "reward_model": {"style": "rule", "ground_truth": "321"}, "extra_info": {"answer": "321"}},
    {"data_source": "t", "prompt": [{"role": "user", "content": "Reverse the digits: 4567"}],
     "reward_model": {"style": "rule", "ground_truth": "7654"}, "extra_info": {"answer": "7654"}},
]


@pytest.fixture(scope="module")
def builtin():
    from transformers import AutoTokenizer

    from rlfleet.models.tiny import ensure_tiny_model

    path = ensure_tiny_model()
    return path, AutoTokenizer.from_pretrained(path)


def test_pair_follows_the_chat_template_and_ends_at_the_end_of_turn(builtin):
    _, tok = builtin
    eos = [tok.eos_token_id]
    prompt_ids, response_ids = sft.tokenize_pair(tok, ROWS[0]["prompt"], "321", eos)
    # the prompt exactly as the rollout renders it for generation
    assert prompt_ids == tok(render_prompt(ROWS[0]["prompt"], tok), add_special_tokens=False)["input_ids"]
    # the response is what the template appends for the assistant turn, cut after the end of turn
    assert response_ids[-1] == tok.eos_token_id and tok.eos_token_id not in response_ids[:-1]
    assert tok.decode(response_ids[:-1]) == "321"
    # a plain-string prompt (no template to follow): the response text plus EOS
    p_ids, r_ids = sft.tokenize_pair(tok, "Reverse the digits: 123", "321", eos)
    assert p_ids == tok("Reverse the digits: 123", add_special_tokens=False)["input_ids"]
    assert tok.decode(r_ids[:-1]) == "321" and r_ids[-1] == tok.eos_token_id


def test_examples_from_parquet_and_jsonl_with_dotted_keys(builtin, tmp_path):
    _, tok = builtin
    parquet = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("".join(json.dumps({"q": r["prompt"][0]["content"], "a": r["extra_info"]["answer"]})
                             + "\n" for r in ROWS))
    examples, too_long = sft.load_examples([parquet], tok, "prompt", "extra_info.answer", 512)
    assert too_long == 0 and [e.index for e in examples] == [0, 1]
    assert tok.decode(examples[1].response_ids[:-1]) == "7654"
    truths, _ = sft.load_examples([parquet], tok, "prompt", "reward_model.ground_truth", 512)
    assert [tok.decode(e.response_ids[:-1]) for e in truths] == ["321", "7654"]
    with pytest.raises(DataError, match=r"b.jsonl, row 0: no value for 'prompt' \(--prompt-key\); its "
                                        r"columns are: q, a"):
        sft.load_examples([jsonl], tok, "prompt", "a", 512)
    from_jsonl, _ = sft.load_examples([jsonl], tok, "q", "a", 512)
    assert [tok.decode(e.response_ids[:-1]) for e in from_jsonl] == ["321", "7654"]
    # too long: left out and counted, never truncated
    shortest = min(len(e.prompt_ids) + len(e.response_ids) for e in examples)
    kept, too_long = sft.load_examples([parquet], tok, "prompt", "extra_info.answer", shortest)
    assert (len(kept), too_long) == (1, 1)
    with pytest.raises(DataError, match="no usable SFT examples"):
        sft.load_examples([parquet], tok, "prompt", "extra_info.answer", 3)
    with pytest.raises(DataError, match="does not exist"):
        sft.load_examples([tmp_path / "none.parquet"], tok, "prompt", "extra_info.answer", 512)


def test_batches_cover_each_epoch_once_in_a_seeded_order():
    examples = [sft.SftExample(i, [1], [2]) for i in range(10)]
    steps = [sft.batch_for_step(examples, 4, s, seed=3) for s in (1, 2, 3)]
    first_epoch = [e.index for batch in steps for e in batch][:10]
    assert sorted(first_epoch) == list(range(10))  # steps 1-3 hold epoch 0, then 2 of epoch 1
    assert [e.index for e in steps[2]][2:] == list(sft.epoch_order(10, 3, 1)[:2])
    assert sft.batch_for_step(examples, 4, 2, seed=3) == steps[1]  # a resumed run sees the same batch
    assert sft.batch_for_step(examples, 4, 1, seed=4) != steps[0]


def test_nll_by_hand():
    # logp = [-1, -2 | -0.5, pad]; advantages 1: per-token loss = -logp where the mask is 1, else 0
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    terms = nll(logp, torch.zeros(2, 2), torch.ones(2, 2), mask, ClipSettings())
    assert terms.loss_B_T.tolist() == [[1.0, 2.0], [0.5, 0.0]]
    assert terms.ratio_B_T.tolist() == [[1.0, 1.0], [1.0, 1.0]] and not terms.clipped_B_T.any()
    terms.loss_B_T.sum().backward()
    assert logp.grad.tolist() == [[-1.0, -1.0], [-1.0, 0.0]]  # d(-logp)/dlogp, nothing from padding


@pytest.mark.parametrize("packed", [False, True])
def test_an_sft_step_is_the_response_only_cross_entropy(builtin, tmp_path, packed):
    """The learner's first SFT step reports (as sft/loss) exactly the mean cross-entropy of the response
    tokens under the starting weights, computed here the plain transformers way (labels -100 on the
    prompt), and then moves the weights."""
    from transformers import AutoModelForCausalLM

    from rlfleet.app.sft_trainer import SFT_ALGORITHM, sft_samples
    from rlfleet.config import LearnerConfig
    from rlfleet.types import TrainBatch
    from services.learner.learner import Learner

    path, tok = builtin
    parquet = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    examples, _ = sft.load_examples([parquet], tok, "prompt", "extra_info.answer", 512)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    total, count = 0.0, 0
    for e in examples:
        ids = torch.tensor([e.prompt_ids + e.response_ids])
        labels = ids.clone()
        labels[0, :len(e.prompt_ids)] = -100
        with torch.no_grad():
            mean = model(input_ids=ids, labels=labels).loss.item()  # mean over this example's response
        total, count = total + mean * len(e.response_ids), count + len(e.response_ids)
    expected = total / count  # token mean over the whole batch

    cfg = LearnerConfig(lr=1e-3, pack_sequences=packed, micro_batch_tokens=16)  # several micro-batches
    learner = Learner(cfg, path, torch.device("cpu"), torch.float32, tmp_path / "ckpt",
                      algorithm=SFT_ALGORITHM)
    before = {k: v.clone() for k, v in learner.named_weights()}
    result = learner.train(TrainBatch(step=1, samples=sft_samples(examples, 0)))
    assert result.metrics["actor/pg_loss"] == pytest.approx(expected, rel=1e-5)
    assert math.isfinite(result.metrics["actor/grad_norm"]) and result.policy_version == 1
    assert any(not torch.equal(before[k], v) for k, v in learner.named_weights())
