"""Learner step throughput, one GPU against a learner sharded over N GPUs (FSDP2, learner.world_size=N).

The same GRPO batches as bench/learner_throughput.py (Qwen2.5-0.5B-shaped, random bf16 weights), split
into micro-batches of --micro-batch-tokens so the N ranks have micro-batches to share. Every rank
drives its ShardedLearner directly with the same batch (what worker_loop does on ranks > 0).
Usage: python bench/fsdp_learner_throughput.py                      # one GPU
       torchrun --standalone --nproc-per-node 2 bench/fsdp_learner_throughput.py   # sharded
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from rlfleet.config import LearnerConfig
from rlfleet.models.tiny import build_tokenizer
from rlfleet.types import TrainBatch, TrainSample


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--response", type=int, default=384)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--out")
    args = parser.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.weight_sync import SHAPES
    from services.learner.learner import Learner

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    if world_size > 1:
        from services.learner.distributed import init_learner_world
        from services.learner.fsdp import ShardedLearner
        world = init_learner_world(world_size, "auto", 0, timeout_s=600)
        rank, device, learner_cls = world.rank, world.device, ShardedLearner
    else:
        device, learner_cls = torch.device("cuda"), Learner
    h, inter, layers, heads, kv, vocab, tied = SHAPES["0.5b"]
    cfg = Qwen2Config(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied)
    # One model folder for every rank (of one host): rank 0 writes it, the others wait, all load it.
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", os.getpid())
    folder = Path(tempfile.gettempdir()) / f"rlfleet-bench-{run_id}"
    if rank == 0:
        torch.manual_seed(0)
        Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
        build_tokenizer().save_pretrained(folder)
    if world_size > 1:
        torch.distributed.barrier()
    learner = learner_cls(LearnerConfig(lr=1e-6, micro_batch_tokens=args.micro_batch_tokens), folder,
                          device, torch.bfloat16, folder / "ckpt")
    if world_size > 1:
        torch.distributed.barrier()
    if rank == 0:
        shutil.rmtree(folder)
    g = torch.Generator().manual_seed(0)  # every rank draws the same batches

    def batch(step: int) -> TrainBatch:
        samples = []
        for i in range(args.seqs):
            prompt = torch.randint(0, vocab, (args.prompt,), generator=g).tolist()
            response = torch.randint(0, vocab, (args.response,), generator=g).tolist()
            samples.append(TrainSample(prompt, response, [-1.0] * args.response, float(i % 2) - 0.5,
                                       step - 1))
        return TrainBatch(step=step, samples=samples)

    learner.train(batch(1))  # warm-up
    times = []
    for step in range(2, args.steps + 2):
        b = batch(step)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        metrics = learner.train(b).metrics
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    tokens = args.seqs * (args.prompt + args.response)
    row = {"world_size": world_size, "tokens_per_step": tokens,
           "micro_batches": metrics["learner/micro_batches"],
           "step_s": step_s, "tokens_per_s": tokens / step_s,
           "peak_mem_gb_rank0": torch.cuda.max_memory_allocated() / 1e9, "pg_loss": metrics["actor/pg_loss"]}
    if rank == 0:
        print(json.dumps(row), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(row, indent=2))
    if world_size > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
