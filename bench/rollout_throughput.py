"""Rollout decode throughput of the transformers backend, one GPU, side by side in one run.

A Qwen2.5-0.5B-shaped model (random bf16 weights) generates `--batch` rows of `--prompt`
random prompt tokens and exactly `--new` new tokens each (no eos, so every arm does the
same work), sampling at temperature 1:
  generate  transformers' generate() (rollout.hf_decode=generate)
  static    rlfleet's static-KV-cache loop, eager (rollout.cuda_graphs=false)
  graphs    the same loop, decode step replayed as a CUDA graph (rollout.compile_decode=false)
  compiled  the step compiled (torch.compile) and then replayed as a CUDA graph (the default on GPU)
Each arm is warmed up once (graph capture included) and then timed `--repeats` times; the
median is reported. Usage: python bench/rollout_throughput.py [--arms generate,static,graphs]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlfleet.types import SamplingParams
from services.rollout.engines.static_generate import StaticGenerator

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                  tie_word_embeddings=True)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024, tie_word_embeddings=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_generate(model, rows: torch.Tensor, new: int) -> torch.Tensor:
    out = model.generate(input_ids=rows, attention_mask=torch.ones_like(rows), do_sample=True,
                         temperature=1.0,
                         top_p=None, top_k=0, max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                         eos_token_id=None)
    return out[:, rows.shape[1]:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", default="generate,static,graphs,compiled")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="tiny shape on the CPU: a smoke check")
    args = ap.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**(TINY if args.tiny else QWEN25_05B))).to(dtype).eval()
    model.requires_grad_(False)
    rows = torch.randint(2, model.config.vocab_size, (args.batch, args.prompt), device=device)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new, seed=0)
    print(f"# {args.batch} rows x ({args.prompt} prompt + {args.new} new tokens), "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, {dtype}, {device}")
    results = {}
    for arm in args.arms.split(","):
        if arm == "generate":
            def fn(n: int = args.new):
                return run_generate(model, rows, n)
            fn(8)  # warm-up: kernels, cuBLAS handles
        else:
            gen = StaticGenerator(model, pad_id=0, eos_ids=[], cuda_graphs=arm in ("graphs", "compiled"),
                                  compile_decode=arm == "compiled")
            listed = rows.tolist()

            def fn(gen=gen, listed=listed):
                return gen.generate(listed, params)[0]
            fn()  # warm-up: the slot's cache is allocated and its step captured
        times = []
        for _ in range(1 if arm == "generate" else args.repeats):
            _sync(device)
            start = time.perf_counter()
            tokens = fn()
            _sync(device)
            times.append(time.perf_counter() - start)
            assert tokens.shape == (args.batch, args.new), tokens.shape
        seconds = statistics.median(times)
        results[arm] = args.batch * args.new / seconds
        print(f"{arm:9s} {seconds * 1e3:9.1f} ms  {results[arm]:10.0f} new tokens/s  "
              f"{seconds / args.new * 1e3:7.2f} ms/step", flush=True)
    if "generate" in results:
        for arm, rate in results.items():
            print(f"{arm:9s} {rate / results['generate']:6.1f}x generate")


if __name__ == "__main__":
    main()
