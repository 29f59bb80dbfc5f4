"""The transformers backend's fast path on a GPU: the static-cache decode loop replayed as a
CUDA graph picks exactly the tokens transformers' generate() picks under greedy decoding
(float32, so no rounding tie can differ), and weights copied in place reach the captured graph.
"""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlfleet.types import SamplingParams
from services.rollout.engines.static_generate import StaticGenerator
from tests.unit.test_static_decode import EOS, PAD, transformers_greedy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPE = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
             num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
             initializer_range=0.2)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    with torch.device("cuda"):
        return Qwen2ForCausalLM(Qwen2Config(**SHAPE)).eval().requires_grad_(False)


def _rows(count: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, SHAPE["vocab_size"], (int(n),), generator=g).tolist()
            for n in torch.randint(3, 40, (count,), generator=g)]


@pytest.mark.parametrize("compile_decode", [False, True], ids=["eager-step", "compiled-step"])
def test_graph_replayed_greedy_decode_matches_generate_and_follows_in_place_weight_updates(compile_decode):
    model, rows = _model(0), _rows(48)  # 48 rows: a batch bucket of 64, so padding rows are replayed too
    generator = StaticGenerator(model, PAD, [EOS], cuda_graphs=True, compile_decode=compile_decode)
    params = SamplingParams(temperature=0.0, max_new_tokens=64)
    ours, _ = generator.generate(rows, params)
    # the step really was captured
    assert generator.slots.get(len(rows), max(map(len, rows)) + 64).graph is not None
    theirs, _ = transformers_greedy(model, rows, 64)
    assert torch.equal(ours[:, :theirs.shape[1]], theirs)
    assert len(set(ours.flatten().tolist())) > 500

    other = _model(1)
    with torch.no_grad():
        for mine, new in zip(model.parameters(), other.parameters()):
            mine.copy_(new)
    after, _ = generator.generate(rows, params)
    expected, _ = transformers_greedy(other, rows, 64)
    assert not torch.equal(after, ours)
    assert torch.equal(after[:, :expected.shape[1]], expected)


@pytest.mark.parametrize("compile_decode", [False, True], ids=["eager-step", "compiled-step"])
def test_rows_that_ended_leave_the_replayed_batch_with_the_tokens_unchanged(compile_decode):
    """Finished-row compaction under CUDA graphs: the narrowed slots are captured at their first step
    (in the middle of a generation) and replayed by the next; greedy tokens stay generate()'s."""
    from tests.unit.test_decode_compaction import greedy_reference

    model, rows = _model(0), _rows(100)  # bucket 128
    eos_ids = list(range(2, SHAPE["vocab_size"], 24))  # 1 token in 24 ends a row: lengths vary
    generator = StaticGenerator(model, PAD, eos_ids, cuda_graphs=True, compile_decode=compile_decode)
    params = SamplingParams(temperature=0.0, max_new_tokens=96)
    first, first_logprobs = generator.generate(rows, params)
    again, again_logprobs = generator.generate(rows, params)  # replays the narrowed slots' graphs
    slot = generator.slots.get(len(rows), max(map(len, rows)) + 96)
    narrowed = [s for s in slot._narrowed.values() if s.graph is not None]
    assert narrowed, "no narrowed slot was captured: the rows did not end at different steps"
    theirs, _ = greedy_reference(model, rows, 96, eos_ids)
    assert torch.equal(first[:, :theirs.shape[1]], theirs)
    assert torch.equal(again, first) and torch.equal(again_logprobs, first_logprobs)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_decode_attention_matches_sdpa_on_the_gpu(dtype):
    """The kernel the decode step uses on a GPU, against SDPA over the visible columns, at a
    SmolLM2-like shape (3 kv heads, 3 queries each, head_dim 64), captured in a CUDA graph."""
    from services.rollout.engines.decode_attention import sdpa_decode_attention, triton_decode_attention

    torch.manual_seed(0)
    B, KV, G, D, L = 48, 3, 3, 64, 320
    q = torch.randn(B, KV * G, 1, D, device="cuda", dtype=dtype).transpose(1, 2).reshape(B, KV, G, D)
    keys, values = torch.randn(2, B, KV, L, D, device="cuda", dtype=dtype).unbind(0)
    column = torch.tensor([200], device="cuda")
    valid = torch.zeros(B, L, dtype=torch.bool, device="cuda")
    for r in range(B):
        valid[r, (r * 7) % 150:201] = True
    keys[:, :, 201:] = float("nan")
    values[:, :, 201:] = float("nan")
    triton_decode_attention(q, keys, values, valid, column, 0.125)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = triton_decode_attention(q, keys, values, valid, column, 0.125)
    graph.replay()
    visible = slice(0, 201)
    ref = sdpa_decode_attention(q.float(), keys[:, :, visible].float(), values[:, :, visible].float(),
                                valid[:, visible], column, 0.125)
    err = ((got.float() - ref).norm() / ref.norm()).item()
    assert err < (1e-2 if dtype == torch.bfloat16 else 1e-5), err  # float32: full-precision dots
