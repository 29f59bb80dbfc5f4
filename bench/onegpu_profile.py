"""Where the real one-GPU job's step goes: decode and learner variants on the real model and prompts.

Loads the real model (e.g. SmolLM2-135M from `rlfleet model import`) and `--prompts` prompts of the
job's data, then in one run on one GPU:
  decode    rlfleet's decode loop on `--prompts` x `--n` rows at the job's temperature and budget,
            per arm (DECODE_ARMS): CUDA graphs with the step eager (rollout.compile_decode=false),
            compiled (the default), and compiled without finished-row compaction: time per
            generation, decode steps, ms per step, new tokens/s, response lengths
  learner   one GRPO train step on the rows it generated (real lengths, responses ending at EOS),
            per learner variant (fused kernels x packing x chunked log-probs): ms per step, tokens/s
  profile   the top GPU kernels of one train step of the first and the last learner variant
Usage: python bench/onegpu_profile.py --model DIR --data train.parquet [--out F.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

# name: LearnerConfig options, every layout option explicit (their nulls mean "on" on a GPU)
LEARNER_VARIANTS = {
    "padded/none": {"fused_kernels": "none", "pack_sequences": False, "logprob_chunk_tokens": 0,
                    "compile": False},
    "padded/liger": {"fused_kernels": "liger", "pack_sequences": False, "logprob_chunk_tokens": 0,
                     "compile": False},
    "both/liger": {"fused_kernels": "liger", "pack_sequences": True, "logprob_chunk_tokens": 8192,
                   "compile": False},
    "both/none": {"fused_kernels": "none", "pack_sequences": True, "logprob_chunk_tokens": 8192,
                  "compile": False},
    "both/compiled": {"fused_kernels": "none", "pack_sequences": True, "logprob_chunk_tokens": 8192,
                      "compile": True},
    "padded/compiled": {"fused_kernels": "none", "pack_sequences": False, "logprob_chunk_tokens": 0,
                        "compile": True},
}


DECODE_ARMS = {  # name: StaticGenerator options
    "graphs": {"compile_decode": False},
    "compiled": {"compile_decode": True},
    "compiled/no-compaction": {"compile_decode": True, "compact": False},
    "compiled/unfused": {"compile_decode": True, "fuse": False},  # q/k/v and gate/up as separate matmuls
    "compiled/sdpa": {"compile_decode": True, "attention": "sdpa"},  # the step's attention by SDPA
}

DEVICE, DTYPE = torch.device("cuda"), torch.bfloat16


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def load_rows(data: Path, tokenizer, count: int, skip: int) -> list[list[int]]:
    from rlfleet.data.prompts import load_prompts

    prompts, _ = load_prompts([data], tokenizer, max_prompt_length=1024)
    return [p.prompt_ids for p in prompts[skip:skip + count]]


def decode(model, tokenizer, rows_per_batch: list[list[list[int]]], n: int, args) -> tuple[dict, list]:
    from rlfleet.types import SamplingParams
    from services.rollout.engines.static_generate import StaticGenerator

    eos = [tokenizer.eos_token_id]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.new, seed=0)
    results, generated = {}, []
    for arm in args.decode_arms.split(","):
        gen = StaticGenerator(model, pad, eos, cuda_graphs=True, **DECODE_ARMS[arm])
        times, steps, new_tokens, lengths = [], [], [], []
        for i, prompts in enumerate(rows_per_batch):
            rows = [r for r in prompts for _ in range(n)]
            _sync()
            t0 = time.perf_counter()
            tokens, logprobs = gen.generate(rows, params)
            _sync()
            seconds = time.perf_counter() - t0
            ends = [(row.index(eos[0]) + 1 if eos[0] in row else len(row)) for row in tokens.tolist()]
            if i == 0:
                results[f"{arm}/first_call_s"] = seconds  # capture (and compilation) included
                continue
            times.append(seconds)
            steps.append(tokens.shape[1])
            new_tokens.append(sum(ends))
            lengths += ends
            if arm == "compiled":
                generated.append((rows, tokens, logprobs, ends))
        s = statistics.median(times)
        median_steps = statistics.median(steps)
        results[arm] = {"generate_s": s, "steps": median_steps, "ms_per_step": s / median_steps * 1e3,
                        "new_tok_s": statistics.median(new_tokens) / s,
                        "response_len": {"mean": statistics.mean(lengths), "p50": statistics.median(lengths),
                                         "p90": sorted(lengths)[int(0.9 * len(lengths))],
                                         "max": max(lengths)},
                        "first_call_s": results.pop(f"{arm}/first_call_s")}
        print(f"decode {arm:22s} {s * 1e3:7.0f} ms/generation  {results[arm]['steps']:.0f} steps  "
              f"{results[arm]['ms_per_step']:.2f} ms/step  {results[arm]['new_tok_s']:,.0f} new tok/s  "
              f"first call {results[arm]['first_call_s']:.1f} s  lengths {results[arm]['response_len']}",
              flush=True)
        if arm == "compiled" and DEVICE.type == "cuda":  # where one generation's GPU time goes
            rows = [r for r in rows_per_batch[1] for _ in range(n)]
            results[arm]["top_kernels"] = top_kernels(lambda g=gen, r=rows: g.generate(r, params), count=20)
        del gen
        gc.collect()
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()
    return results, generated


def train_batches(generated, steps: int, fresh: bool):
    """steps + 1 train batches (the first is a warm-up): the first generation's rows each time, or with
    `fresh` each generation's own rows in turn (shapes that change every step, as in a run)."""
    from rlfleet.types import TrainBatch, TrainSample

    def samples_of(rows, tokens, logprobs, ends):
        return [TrainSample(prompt, tokens[i, :end].tolist(), logprobs[i, :end].tolist(),
                            1.0 if i % 3 == 0 else -0.5, 0)
                for i, (prompt, end) in enumerate(zip(rows, ends))]

    return [TrainBatch(step=s + 1, samples=samples_of(*generated[s % len(generated) if fresh else 0]),
                       temperature=1.0) for s in range(steps + 1)]


def top_kernels(fn, count: int = 12) -> list[tuple[str, float, int]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _sync()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in rows)
    print(f"  kernels: {sum(e.count for e in rows)}, GPU time {total / 1e3:.1f} ms", flush=True)
    out = [(e.key[:90], e.self_device_time_total / 1e3, e.count) for e in rows[:count]]
    for key, ms, calls in out:
        print(f"    {ms:8.2f} ms {calls:6d}x  {key}")
    return out


def learner(model_dir: Path, batches, args) -> dict:
    from rlfleet.config import LearnerConfig
    from services.learner.learner import Learner

    results = {}
    names = [n for n in args.variants.split(",") if n]
    if args.memory_fraction and DEVICE.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction, torch.cuda.current_device())
    tokens = statistics.mean(sum(len(s.prompt_ids) + len(s.response_ids) for s in b.samples)
                             for b in batches[1:])  # real tokens per timed step
    for j, name in enumerate(names):
        with tempfile.TemporaryDirectory() as ckpt:
            lrn = Learner(LearnerConfig(lr=1e-7, micro_batch_tokens=args.micro_batch_tokens,
                                        **LEARNER_VARIANTS[name]),
                          model_dir, DEVICE, DTYPE, Path(ckpt), max_response_tokens=args.new)
            lrn.train(batches[0])
            times = []
            for b in batches[1:]:
                _sync()
                t0 = time.perf_counter()
                lrn.train(b)
                _sync()
                times.append(time.perf_counter() - t0)
            s = statistics.median(times)
            results[name] = {"train_s": s, "tokens_per_s": tokens / s, "train_s_each": times}
            print(f"learner {name:14s} {s * 1e3:7.0f} ms/step  {tokens / s:,.0f} tok/s "
                  f"({tokens} real tokens)",
                  flush=True)
            if j in (0, len(names) - 1) and DEVICE.type == "cuda":
                results[name]["top_kernels"] = top_kernels(lambda lrn=lrn: lrn.train(batches[1]))
            del lrn
            gc.collect()
            torch.cuda.empty_cache()
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--generations", type=int, default=4,
                    help="timed generations per decode arm (+1 warm-up)")
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--micro-batch-tokens", type=int, default=32768)
    ap.add_argument("--variants", default=",".join(LEARNER_VARIANTS))
    ap.add_argument("--decode-arms", default=",".join(DECODE_ARMS))
    ap.add_argument("--fresh-batches", action="store_true",
                    help="train on each generation's rows in turn (shapes change every step, as in a run) "
                         "instead of the first generation's rows every step")
    ap.add_argument("--memory-fraction", type=float, default=None,
                    help="cap the learner's GPU memory as `rlfleet run` does on a shared GPU "
                         "(learner.gpu_memory_utilization, 0.60 by default there)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke check of the script (tiny model)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    global DEVICE, DTYPE
    DEVICE = torch.device(args.device)
    DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=DTYPE).to(DEVICE).eval()
    model.requires_grad_(False)
    batches = [load_rows(args.data, tokenizer, args.prompts, i * args.prompts)
               for i in range(args.generations + 1)]
    report = {"args": {k: str(v) for k, v in vars(args).items()}}
    report["decode"], generated = decode(model, tokenizer, batches, args.n, args)
    del model
    gc.collect()
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    if args.variants:  # --variants "": the decode arms only
        batches = train_batches(generated, args.train_steps, args.fresh_batches)
        report["learner"] = learner(args.model, batches, args)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
