"""Learner step throughput and MFU on a Qwen2.5-0.5B-shaped model (random bf16 weights), one GPU.

Drives the learner core (services.learner.learner.Learner) directly with GRPO batches of
`--seqs` sequences of `--prompt` + `--response` tokens and reports trained tokens/s and
model FLOPs utilisation (6 x parameters x tokens / step time / peak bf16 FLOP/s).
Usage: python bench/learner_throughput.py [--peak-tflops 989] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from rlfleet.config import LearnerConfig
from rlfleet.models.tiny import build_tokenizer
from rlfleet.types import TrainBatch, TrainSample


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--response", type=int, default=384)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="H100/H200 dense bf16")
    parser.add_argument("--out")
    args = parser.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.weight_sync import SHAPES
    from services.learner.learner import Learner

    h, inter, layers, heads, kv, vocab, tied = SHAPES["0.5b"]
    cfg = Qwen2Config(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied)
    with tempfile.TemporaryDirectory() as tmp:
        Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp)
        build_tokenizer().save_pretrained(tmp)
        learner = Learner(LearnerConfig(lr=1e-6, micro_batch_tokens=args.micro_batch_tokens), Path(tmp),
                          torch.device("cuda"), torch.bfloat16, Path(tmp) / "ckpt")
    params = sum(p.numel() for p in learner.model.parameters())
    g = torch.Generator().manual_seed(0)

    def batch(step: int) -> TrainBatch:
        samples = []
        for i in range(args.seqs):
            prompt = torch.randint(0, vocab, (args.prompt,), generator=g).tolist()
            response = torch.randint(0, vocab, (args.response,), generator=g).tolist()
            samples.append(TrainSample(prompt, response, [-1.0] * args.response, float(i % 2) - 0.5, step - 1))
        return TrainBatch(step=step, samples=samples)

    learner.train(batch(1))  # warm-up
    torch.cuda.synchronize()
    times = []
    for step in range(2, args.steps + 2):
        b = batch(step)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        learner.train(b)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    tokens = args.seqs * (args.prompt + args.response)
    tok_s = tokens / step_s
    mfu = 6 * params * tok_s / (args.peak_tflops * 1e12)
    row = {"params": params, "tokens_per_step": tokens, "step_s": step_s, "tokens_per_s": tok_s, "mfu": mfu,
           "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9}
    print(f"learner 0.5b: {tokens} tokens/step | {step_s * 1e3:.0f} ms/step | {tok_s:,.0f} tok/s | "
          f"MFU {mfu * 100:.1f}% | peak {row['peak_mem_gb']:.1f} GB", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
