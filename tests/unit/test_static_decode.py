"""rlfleet's static-KV-cache decode loop against transformers' generate() on CPU.

Greedy decoding in float32 must pick the very same tokens, with the same logprobs, for every
architecture the loop runs; the GPU counterpart (CUDA graphs) is tests/gpu/test_fast_rollout.py.
"""
from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rlfleet.types import SamplingParams
from services.rollout.engines.decoder import unsupported_reason
from services.rollout.engines.graphs import batch_bucket, length_bucket
from services.rollout.engines.static_generate import StaticGenerator

pytestmark = pytest.mark.unit

PAD, EOS = 0, 1
# Prompts of different lengths, so rows are left-padded differently.
ROWS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16], [20] * 9, [3]]
SHAPE = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256,
             initializer_range=0.5)  # large init: varied tokens


def _model(kind: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=True)).eval()
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16)).eval()
    return LlamaForCausalLM(LlamaConfig(**SHAPE, rope_scaling={"rope_type": "linear", "factor": 2.0})).eval()


def transformers_greedy(model: torch.nn.Module, rows: list[list[int]],
                        new: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = torch.tensor(r), 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                         min_new_tokens=1,
                         pad_token_id=PAD, eos_token_id=[EOS], return_dict_in_generate=True,
                         output_logits=True)
    tokens = out.sequences[:, width:]
    logprobs = torch.stack(out.logits, 1).float().log_softmax(-1).gather(2, tokens[..., None])[..., 0]
    return tokens.cpu(), logprobs.cpu()


def _until_eos(tokens: torch.Tensor, values: torch.Tensor, row: int) -> torch.Tensor:
    ids = tokens[row].tolist()
    end = ids.index(EOS) + 1 if EOS in ids else len(ids)
    return values[row, :end]


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_greedy_tokens_and_logprobs_match_transformers_generate(kind):
    model = _model(kind)
    ours, our_logprobs = StaticGenerator(model, PAD, [EOS], cuda_graphs=False).generate(
        ROWS, SamplingParams(temperature=0.0, max_new_tokens=24))
    theirs, their_logprobs = transformers_greedy(model, ROWS, 24)
    assert ours.shape == theirs.shape
    assert torch.equal(ours, theirs)
    assert len(set(ours.flatten().tolist())) > 20  # really varied output, not one repeated token
    for row in range(len(ROWS)):
        torch.testing.assert_close(_until_eos(ours, our_logprobs, row),
                                   _until_eos(theirs, their_logprobs, row),
                                   atol=1e-4, rtol=0)


def test_rows_end_at_eos_and_generation_stops_when_every_row_has():
    model = _model("qwen2")
    with torch.no_grad():  # make eos the likeliest token once anything has been generated
        model.lm_head.weight[EOS] = model.lm_head.weight[2:].mean(0) * 0 + 3 * model.model.norm.weight.sign()
    tokens, logprobs = StaticGenerator(model, PAD, [EOS], cuda_graphs=False).generate(
        ROWS, SamplingParams(temperature=0.0, max_new_tokens=40))
    theirs, _ = transformers_greedy(model, ROWS, 40)
    assert tokens.shape[1] < 40  # stopped early: every row has its eos (looked at every few steps)
    assert torch.equal(tokens[:, :theirs.shape[1]], theirs) and tokens[:, theirs.shape[1]:].eq(PAD).all()
    for row in range(len(ROWS)):
        ids = tokens[row].tolist()
        assert ids[0] != EOS  # at least one token before eos, as generate(min_new_tokens=1)
        end = ids.index(EOS) + 1
        assert set(ids[end:]) <= {PAD} and logprobs[row, end:].eq(0).all()


def test_weights_copied_in_place_are_used_by_the_next_generation():
    model, other = _model("qwen2", seed=0), _model("qwen2", seed=1)
    generator = StaticGenerator(model, PAD, [EOS], cuda_graphs=False)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    before, _ = generator.generate(ROWS, params)
    with torch.no_grad():
        for mine, theirs in zip(model.parameters(), other.parameters()):
            mine.copy_(theirs)
    after, _ = generator.generate(ROWS, params)
    assert not torch.equal(before, after)
    assert torch.equal(after, transformers_greedy(other, ROWS, 12)[0])


def test_sampling_is_reproducible_with_a_seed_and_top_k_1_is_greedy():
    model = _model("qwen2")
    generator = StaticGenerator(model, PAD, [EOS], cuda_graphs=False)
    sampled = SamplingParams(temperature=1.3, top_p=0.9, top_k=20, max_new_tokens=16, seed=7)
    first, logprobs = generator.generate(ROWS, sampled)
    again, _ = generator.generate(ROWS, sampled)
    other, _ = generator.generate(ROWS, SamplingParams(temperature=1.3, top_p=0.9, top_k=20,
                                                       max_new_tokens=16, seed=8))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert (logprobs <= 0).all()
    top1, _ = generator.generate(ROWS, SamplingParams(temperature=0.7, top_k=1, max_new_tokens=16, seed=1))
    greedy, _ = generator.generate(ROWS, SamplingParams(temperature=0.0, max_new_tokens=16))
    assert torch.equal(top1, greedy)


def test_top_p_keeps_only_the_nucleus():
    """With top_p small enough to keep one token per step, sampling is greedy whatever the seed."""
    model = _model("llama")
    generator = StaticGenerator(model, PAD, [EOS], cuda_graphs=False)
    greedy, _ = generator.generate(ROWS, SamplingParams(temperature=0.0, max_new_tokens=10))
    for seed in range(3):
        nucleus, _ = generator.generate(ROWS, SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=10,
                                                             seed=seed))
        assert torch.equal(nucleus, greedy)


def test_prefill_in_row_blocks_gives_the_same_tokens(monkeypatch):
    from services.rollout.engines import static_generate

    model = _model("qwen2")
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    whole, _ = StaticGenerator(model, PAD, [EOS], cuda_graphs=False).generate(ROWS, params)
    monkeypatch.setattr(static_generate, "PREFILL_TOKENS", 10)  # one row (width 9) per block
    blocks, _ = StaticGenerator(model, PAD, [EOS], cuda_graphs=False).generate(ROWS, params)
    assert torch.equal(whole, blocks)


def test_unsupported_architectures_are_named():
    model = _model("qwen2")
    assert unsupported_reason(model) is None
    model.config.model_type = "gpt_neox"
    assert "gpt_neox" in unsupported_reason(model)


def test_buckets_round_up():
    assert [batch_bucket(n) for n in (1, 3, 64, 65, 256)] == [1, 4, 64, 128, 256]
    assert [length_bucket(n) for n in (1, 64, 65, 384)] == [64, 64, 128, 384]
    assert [length_bucket(n, 16) for n in (1, 17, 26, 32)] == [16, 32, 32, 32]


def test_on_the_cpu_the_cache_holds_the_prompt_and_new_tokens_rounded_to_16_columns():
    # 17 prompt + 8 new tokens: a 32-column cache, not 64 (on a GPU 64, so captured graphs are shared)
    gen = StaticGenerator(_model("qwen2"), PAD, [EOS], cuda_graphs=False)
    gen.generate([[5] * 17, [6] * 3], SamplingParams(temperature=0.0, max_new_tokens=8))
    assert [slot.cache.length for slot in gen.slots._slots.values()] == [32]


def test_engine_gives_the_same_completions_by_either_decode_path(tiny_model_dir, tiny_tokenizer):
    """HFEngine end to end (padding, stop strings, text) with rollout.hf_decode=static and =generate."""
    from rlfleet.types import PromptRequest
    from services.rollout.engines.hf import HFEngine

    prompts = [PromptRequest(request_id=str(i), prompt_ids=tiny_tokenizer(text)["input_ids"])
               for i, text in enumerate(["reverse: 123 =", "reverse: 98765 =", "reverse: 4 ="])]
    results = {}
    for decode in ("static", "generate"):
        engine = HFEngine(tiny_model_dir, torch.device("cpu"), torch.float32, max_batch_sequences=4,
                          decode=decode)
        assert (engine._static is not None) == (decode == "static")
        for stop in ((), ("pl",)):
            groups = engine.generate(prompts, SamplingParams(n=2, temperature=0.0, max_new_tokens=12,
                                                             stop=stop))
            results[decode, stop] = sorted((g.request_id, [(c.token_ids, c.text, c.finish_reason)
                                                           for c in g.completions])
                                           for g in groups)
    assert results["static", ()] == results["generate", ()]
    assert results["static", ("pl",)] == results["generate", ("pl",)]
    cut = [c for _, cs in results["static", ("pl",)] for c in cs]
    assert all(text.endswith("pl") and reason == "stop"
               for _, text, reason in cut)  # cut right after the stop string


def test_compiled_layer_regions_compute_the_same_step():
    """rollout.compile_decode: the compiled regions before and after the attention (one compilation
    shared by every layer) give the eager step's logits and cache writes."""
    from services.rollout.engines.decoder import KVCache, StaticDecoder

    model = _model("qwen3")
    results = []
    for compiled in (False, True):
        torch.manual_seed(3)
        cache = KVCache.allocate(model, 4, 16)
        cache.keys.normal_()
        cache.values.normal_()
        valid = torch.zeros(4, 16, dtype=torch.bool)
        valid[:, :6] = True
        with torch.no_grad():
            logits = StaticDecoder(model, compile_layers=compiled).step(
                cache, torch.tensor([5, 6, 7, 8]), torch.tensor([6, 5, 4, 6]), torch.tensor([6]), valid)
        results.append((logits, cache.keys.clone(), valid.clone()))
    (eager, eager_keys, eager_valid), (compiled, compiled_keys, compiled_valid) = results
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(compiled_keys, eager_keys, atol=1e-5, rtol=1e-5)
    assert torch.equal(compiled_valid, eager_valid) and bool(compiled_valid[:, 6].all())


def test_repeated_prompts_are_prefilled_once_and_decode_as_generate_does(monkeypatch):
    """A GRPO group's n rows share their prompt: it is prefilled once and copied to each row's cache."""
    model = _model("llama")
    rows = [r for r in ROWS for _ in range(3)]  # 5 distinct prompts, 3 rows each
    generator = StaticGenerator(model, PAD, [EOS], cuda_graphs=False)
    prefilled = []
    real_prefill = generator.decoder.prefill
    monkeypatch.setattr(generator.decoder, "prefill",
                        lambda cache, ids, *a: prefilled.append(ids.shape[0]) or real_prefill(cache, ids, *a))
    ours, our_logprobs = generator.generate(rows, SamplingParams(temperature=0.0, max_new_tokens=16))
    assert sum(prefilled) == len(ROWS) + 1  # the distinct prompts, and one bucket padding row
    theirs, their_logprobs = transformers_greedy(model, rows, 16)
    assert torch.equal(ours, theirs)
    for row in range(len(rows)):
        torch.testing.assert_close(_until_eos(ours, our_logprobs, row),
                                   _until_eos(theirs, their_logprobs, row),
                                   atol=1e-4, rtol=0)


def test_a_region_that_fails_to_compile_runs_eager_from_then_on(monkeypatch):
    """rollout.compile_decode on a machine where compiling fails (no Triton, no C compiler): the
    step runs eager and gives the same logits, instead of failing the generation."""
    from services.rollout.engines import decoder as decoder_module
    from services.rollout.engines.decoder import KVCache, StaticDecoder

    def broken_compile(fn, **_):
        def fails(*args):
            raise RuntimeError("InductorError: no working C compiler")
        return fails

    monkeypatch.setattr(decoder_module.torch, "compile", broken_compile)
    model = _model("llama")
    results = []
    for compiled in (False, True):
        cache = KVCache.allocate(model, 2, 8)
        valid = torch.zeros(2, 8, dtype=torch.bool)
        valid[:, :3] = True
        dec = StaticDecoder(model, compile_layers=compiled)
        with torch.no_grad():
            results.append(dec.step(cache, torch.tensor([5, 6]), torch.tensor([3, 3]), torch.tensor([3]),
                                    valid))
    assert torch.equal(results[0], results[1])
    assert dec.pre_attention.compiled is None and dec.post_attention.compiled is None


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fused_projections_follow_weights_copied_in_place(kind):
    """The decoder runs q/k/v and gate/up as one matmul each over matrices the model's own weights are
    views of; a weight sync copies into the model in place, so the next generation must be the new
    weights' (here: another model's weights copied in, then greedy tokens equal to that model's)."""
    from rlfleet.weights import apply_to_module
    from rlfleet.weights.naming import model_weights

    model, other = _model(kind, seed=0), _model(kind, seed=1)
    gen = StaticGenerator(model, PAD, [EOS], cuda_graphs=False)
    layer, fused = model.model.layers[0], gen.decoder.fused[0]
    assert layer.self_attn.k_proj.weight.data_ptr() == fused.qkv_weight[fused.qkv_sizes[0]:].data_ptr()
    apply_to_module(model, {name: t.clone() for name, t in model_weights(other)})
    up_rows = fused.gate_up_weight[layer.mlp.gate_proj.out_features:]
    assert torch.equal(up_rows, other.model.layers[0].mlp.up_proj.weight)
    tokens, _ = gen.generate(ROWS, SamplingParams(temperature=0.0, max_new_tokens=6))
    expected, _ = transformers_greedy(other, ROWS, 6)
    for i in range(len(ROWS)):
        assert torch.equal(_until_eos(tokens, tokens, i), _until_eos(expected, expected, i))
