"""Learner step throughput and MFU on a Qwen2.5-0.5B-shaped model (random bf16 weights), one GPU,
for several learner configurations side by side in one run (same GPU, same batches).

Drives the learner core (services.learner.learner.Learner) directly with GRPO batches of
`--seqs` sequences of `--prompt` + `--response` tokens and reports trained tokens/s and
model FLOPs utilisation (6 x parameters x tokens / step time / peak bf16 FLOP/s) per config:
  baseline  padded rows, full-vocabulary logits, eager layers
  chunked   + learner.logprob_chunk_tokens=--chunk
  packed    + learner.pack_sequences
  both      chunked + packed
  compiled  both + learner.compile (each decoder layer compiled)
  default   the learner's defaults as they resolve on this device (a GPU: packed, chunked, compiled)
  ckpt      both + learner.gradient_checkpointing, micro_batch_tokens x --ckpt-mb-scale
Each config runs once per `--fused-kernels` setting (learner.fused_kernels: none, liger), named
config/setting.
`--ragged` draws response lengths in [response/4, response] (what packing is for); tokens/s
counts real tokens only. `--tiny` runs a tiny shape on the CPU as a smoke check.
Usage: python bench/learner_throughput.py [--configs baseline,both] [--ragged] [--peak-tflops 989] [--out
FILE]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlfleet.config import LearnerConfig
from rlfleet.models.tiny import build_tokenizer
from rlfleet.types import TrainBatch, TrainSample

CONFIGS = ("baseline", "chunked", "packed", "both", "compiled", "default", "ckpt")
TINY = (64, 128, 2, 4, 2, 1000, True)  # hidden, intermediate, layers, heads, kv heads, vocab, tied


def learner_options(name: str, args: argparse.Namespace) -> dict:
    """Every layout option explicit (their nulls mean "on" on a GPU), except in `default`."""
    baseline = {"logprob_chunk_tokens": 0, "pack_sequences": False, "compile": False}
    chunked = {**baseline, "logprob_chunk_tokens": args.chunk}
    both = {**chunked, "pack_sequences": True}
    return {"baseline": baseline, "chunked": chunked, "packed": {**baseline, "pack_sequences": True},
            "both": both, "compiled": {**both, "compile": True}, "default": {},
            "ckpt": {**both, "gradient_checkpointing": True,
                     "micro_batch_tokens": args.micro_batch_tokens * args.ckpt_mb_scale}}[name]


def make_batches(args: argparse.Namespace, vocab: int) -> list[TrainBatch]:
    g = torch.Generator().manual_seed(0)
    batches = []
    for step in range(1, args.steps + 2):  # the first is the warm-up
        samples = []
        for i in range(args.seqs):
            length = args.response
            if args.ragged:
                length = int(torch.randint(max(1, args.response // 4), args.response + 1, (1,), generator=g))
            prompt = torch.randint(0, vocab, (args.prompt,), generator=g).tolist()
            response = torch.randint(0, vocab, (length,), generator=g).tolist()
            samples.append(TrainSample(prompt, response, [-1.0] * length, float(i % 2) - 0.5, step - 1))
        batches.append(TrainBatch(step=step, samples=samples))
    return batches


def measure(name: str, args, model_dir: Path, device: torch.device, dtype: torch.dtype, batches) -> dict:
    from services.learner.learner import Learner

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    config, fused = name.split("/")
    options = {"micro_batch_tokens": args.micro_batch_tokens, "fused_kernels": fused,
               **learner_options(config, args)}
    learner = Learner(LearnerConfig(lr=1e-6, **options), model_dir, device, dtype, model_dir / "ckpt",
                      max_response_tokens=args.response)
    params = sum(p.numel() for p in learner.model.parameters())
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    learner.train(batches[0])  # warm-up
    sync()
    times = []
    for b in batches[1:]:
        sync()
        t0 = time.perf_counter()
        learner.train(b)
        sync()
        times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in batches[1].samples)
    tok_s = tokens / step_s
    mfu = 6 * params * tok_s / (args.peak_tflops * 1e12)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else float("nan")
    del learner
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"config": name, "options": options, "params": params, "tokens_per_step": tokens, "step_s": step_s,
            "tokens_per_s": tok_s, "mfu": mfu, "peak_mem_gb": peak_gb}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--response", type=int, default=384)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--chunk", type=int, default=4096,
                        help="learner.logprob_chunk_tokens of chunked configs")
    parser.add_argument("--ckpt-mb-scale", type=int, default=4,
                        help="micro-batch multiplier of the ckpt config")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    parser.add_argument("--ragged", action="store_true", help="response lengths vary (padding to remove)")
    parser.add_argument("--tiny", action="store_true", help="tiny fp32 shape on the CPU (smoke check)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="H100/H200 dense bf16")
    parser.add_argument("--fused-kernels", default="none",
                        help="comma list of learner.fused_kernels settings")
    parser.add_argument("--out")
    args = parser.parse_args()
    configs = [n.strip() for n in args.configs.split(",") if n.strip()]
    if unknown := sorted(set(configs) - set(CONFIGS)):
        parser.error(f"unknown configs {unknown}; choose from {', '.join(CONFIGS)}")
    names = [f"{c}/{f}" for f in args.fused_kernels.split(",") for c in configs]
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if __package__ in (None, ""):  # run as a script: make the repository root importable for bench.*
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.weight_sync import SHAPES

    if args.tiny:
        device, dtype, shape = torch.device("cpu"), torch.float32, TINY
    else:
        device, dtype, shape = torch.device("cuda"), torch.bfloat16, SHAPES["0.5b"]
    h, inter, layers, heads, kv, vocab, tied = shape
    cfg = Qwen2Config(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied)
    batches = make_batches(args, vocab)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        Qwen2ForCausalLM(cfg).to(dtype).save_pretrained(tmp)
        build_tokenizer().save_pretrained(tmp)
        for name in names:
            try:
                row = measure(name, args, Path(tmp), device, dtype, batches)
            except torch.OutOfMemoryError as exc:  # report and go on: the other configs still count
                print(f"{name:9s}: out of memory ({str(exc).splitlines()[0]})", flush=True)
                gc.collect()
                torch.cuda.empty_cache()
                continue
            rows.append(row)
            print(f"{name:9s}: {row['tokens_per_step']} tokens/step | {row['step_s'] * 1e3:.0f} ms/step | "
                  f"{row['tokens_per_s']:,.0f} tok/s | MFU {row['mfu'] * 100:.1f}% | "
                  f"peak {row['peak_mem_gb']:.1f} GB | {row['options']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
