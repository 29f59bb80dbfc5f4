"""Finished rows stop costing decode steps: the static loop moves its unfinished rows to a narrower
slot as rows end at EOS, and the tokens and logprobs are those of transformers' generate().

Several eos ids make rows end at different steps with a random tiny model, as GRPO's answers do."""
from __future__ import annotations

import pytest
import torch

from rlfleet.types import SamplingParams
from services.rollout.engines import static_generate
from services.rollout.engines.static_generate import StaticGenerator
from tests.unit.test_static_decode import PAD, _model

pytestmark = pytest.mark.unit

EOS_IDS = list(range(1, 24))  # about a quarter of the vocabulary ends a row: varied lengths
ROWS = [[5 + i, 40 + i % 7, 60 + i % 5][: 1 + i % 3] for i in range(40)]  # 40 rows: batch bucket 64


def greedy_reference(model, rows, new, eos_ids=EOS_IDS):
    """transformers' greedy generate() with several eos ids: tokens and logprobs on the CPU."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = torch.tensor(r), 1
    out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                         do_sample=False, max_new_tokens=new, min_new_tokens=1, pad_token_id=PAD,
                         eos_token_id=eos_ids, return_dict_in_generate=True, output_logits=True)
    tokens = out.sequences[:, width:]
    logprobs = torch.stack(out.logits, 1).float().log_softmax(-1).gather(2, tokens[..., None])[..., 0]
    return tokens.cpu(), logprobs.cpu()


def _decode_batches(monkeypatch, generator):
    """The batch size of every decode step `generator` runs."""
    seen = []
    real_step = generator.decoder.step
    monkeypatch.setattr(generator.decoder, "step",
                        lambda cache, ids, *a: seen.append(ids.shape[0]) or real_step(cache, ids, *a))
    return seen


def _until_eos(tokens, values, row):
    ids = tokens[row].tolist()
    end = next((i + 1 for i, t in enumerate(ids) if t in EOS_IDS), len(ids))
    return values[row, :end]


def test_rows_that_ended_leave_the_decode_batch_and_the_output_is_generates(monkeypatch):
    model = _model("llama")
    generator = StaticGenerator(model, PAD, EOS_IDS, cuda_graphs=False)
    batches = _decode_batches(monkeypatch, generator)
    ours, our_logprobs = generator.generate(ROWS, SamplingParams(temperature=0.0, max_new_tokens=40))
    theirs, their_logprobs = greedy_reference(model, ROWS, 40)
    # the decode batch shrank from the 64-row bucket as rows ended, and never below 8 rows
    assert batches[0] == 64 and batches[-1] < 64 and min(batches) >= static_generate.MIN_COMPACT_BATCH
    assert batches == sorted(batches, reverse=True)
    assert sum(batches) < 0.6 * 64 * len(batches)  # most of the rows' steps were not computed
    assert torch.equal(ours[:, :theirs.shape[1]], theirs) and ours[:, theirs.shape[1]:].eq(PAD).all()
    for row in range(len(ROWS)):
        torch.testing.assert_close(_until_eos(ours, our_logprobs, row),
                                   _until_eos(theirs, their_logprobs, row), atol=1e-4, rtol=0)
        assert our_logprobs[row, len(_until_eos(ours, our_logprobs, row)):].eq(0).all()


def test_compaction_changes_no_greedy_token_and_sampling_stays_seeded(monkeypatch):
    model = _model("qwen2")
    compacted = StaticGenerator(model, PAD, EOS_IDS, cuda_graphs=False)
    full = StaticGenerator(model, PAD, EOS_IDS, cuda_graphs=False, compact=False)
    full_batches = _decode_batches(monkeypatch, full)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=32)
    tokens, logprobs = compacted.generate(ROWS, greedy)
    full_tokens, full_logprobs = full.generate(ROWS, greedy)
    assert set(full_batches) == {64}
    assert torch.equal(tokens, full_tokens)
    torch.testing.assert_close(logprobs, full_logprobs, atol=1e-5, rtol=0)
    sampled = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=32, seed=11)
    first, first_logprobs = compacted.generate(ROWS, sampled)
    again, _ = compacted.generate(ROWS, sampled)
    assert torch.equal(first, again) and (first_logprobs <= 0).all()
    for row in range(len(ROWS)):  # padding (logprob 0) after each row's eos, never before
        ended = len(_until_eos(first, first_logprobs, row))
        assert first[row, ended:].eq(PAD).all() and first_logprobs[row, ended:].eq(0).all()
        assert first_logprobs[row, :ended].lt(0).all()
