"""One decode step of the static loop, timed alone on one GPU: where a step's milliseconds go.

A model of a real shape (SmolLM2-135M or Qwen2.5-0.5B; random bf16 weights, random cache contents)
runs one decode step over a `--batch` x `--length` KV cache, replayed as a CUDA graph, for:
  eager         the step's layers run module by module (rollout.compile_decode=false)
  compiled      the regions before and after the attention compiled (the default on GPU)
  compiled+X    the same with the attention computed another way (X: matmul, float-mask), to see
                what the attention kernel costs
and times the sampler (temperature 0.7, full vocabulary) and the prefill of the batch apart.
Usage: python bench/decode_step.py [--shape smollm2-135m] [--batch 512] [--length 320] [--out F.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

SHAPES = {
    "smollm2-135m": (LlamaForCausalLM, LlamaConfig, dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192)),
    "qwen2.5-0.5b": (Qwen2ForCausalLM, Qwen2Config, dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768)),
}


_SDPA = F.scaled_dot_product_attention  # kept: the variants replace the name the decoder calls


def _matmul_attention(q, k, v, attn_mask, scale):
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    weights = torch.softmax(scores.masked_fill(~attn_mask, float("-inf")), dim=-1).to(q.dtype)
    return torch.matmul(weights, v)


def _float_mask_attention(q, k, v, attn_mask, scale):
    bias = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, float("-inf"))
    return _SDPA(q, k, v, attn_mask=bias, scale=scale)


ATTENTION = {"sdpa": _SDPA, "matmul": _matmul_attention,
             "float-mask": _float_mask_attention}


def _time_graph(fn, reps: int) -> float:
    """Median ms of `fn` replayed as a CUDA graph (captured after two warm-up calls)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    from rlfleet.types import SamplingParams
    from services.rollout.engines import decoder as decoder_module
    from services.rollout.engines.decoder import KVCache, StaticDecoder
    from services.rollout.engines.sampling import TokenSampler

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--length", type=int, default=320, help="cache columns")
    ap.add_argument("--valid", type=int, default=200, help="columns a row attends to")
    ap.add_argument("--variants", default="eager,compiled,compiled+matmul,compiled+float-mask")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    model_cls, config_cls, shape = SHAPES[args.shape]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_cls(config_cls(**shape)).to(torch.bfloat16).eval().requires_grad_(False)
    batch, length = args.batch, args.length
    report = {"shape": args.shape, "batch": batch, "length": length, "valid": args.valid}
    cache = KVCache.allocate(model, batch, length)
    cache.keys.normal_()
    cache.values.normal_()
    ids = torch.randint(0, shape["vocab_size"], (batch,), device="cuda")
    positions = torch.full((batch,), args.valid, device="cuda")
    column = torch.tensor([args.valid], device="cuda")
    valid = torch.zeros(batch, length, dtype=torch.bool, device="cuda")
    valid[:, :args.valid] = True
    original = decoder_module.F.scaled_dot_product_attention
    for variant in args.variants.split(","):
        regions, _, attention = variant.partition("+")
        decoder_module.F.scaled_dot_product_attention = ATTENTION[attention or "sdpa"]
        try:
            dec = StaticDecoder(model, compile_layers=regions == "compiled")
            t0 = time.perf_counter()
            with torch.no_grad():
                dec.step(cache, ids, positions, column, valid)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            with torch.no_grad():
                ms = _time_graph(lambda dec=dec: dec.step(cache, ids, positions, column, valid), args.reps)
        finally:
            decoder_module.F.scaled_dot_product_attention = original
        report[variant] = {"ms_per_step": ms, "first_call_s": first}
        print(f"{variant:22s} {ms:7.3f} ms/step (graph)  first call {first:6.1f} s", flush=True)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    logits = torch.randn(batch, shape["vocab_size"], device="cuda")
    sampler = TokenSampler(SamplingParams(temperature=0.7, max_new_tokens=1), [2], torch.device("cuda"))
    report["sampler_ms"] = _time_graph(lambda: sampler(logits, first=False), args.reps)
    print(f"{'sampler':22s} {report['sampler_ms']:7.3f} ms/step (graph)")
    dec = StaticDecoder(model)
    prompt = torch.randint(0, shape["vocab_size"], (batch, args.valid), device="cuda")
    pos = torch.arange(args.valid, device="cuda").expand(batch, -1)
    with torch.no_grad():
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dec.prefill(cache, prompt, pos, valid[:, :args.valid])
            torch.cuda.synchronize()
    report["prefill_ms"] = (time.perf_counter() - t0) * 1e3
    print(f"{'prefill (eager)':22s} {report['prefill_ms']:7.1f} ms for {batch} x {args.valid} tokens")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
