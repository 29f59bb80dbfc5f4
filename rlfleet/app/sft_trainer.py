"""The loop of `rlfleet sft`: supervised steps through the learner's own training path.

An SFT step is a learner Train call whose samples are (prompt, reference response) pairs with
advantage 1 under the `nll` policy loss (services/learner/algorithms/policy_losses.py), token-mean
aggregated: the cross-entropy of the response tokens, averaged over the step's response tokens.
Everything else is the learner's: micro-batches by `learner.micro_batch_tokens`, packing
(`learner.pack_sequences`), chunked log-probs, LoRA (`learner.lora.rank`), gradient clipping, the
LR schedule, FSDP2 under torchrun (`learner.world_size > 1`: every rank runs this loop on the same
batches, and the sharded learner splits each batch's micro-batches between ranks), checkpoints
(`checkpoints/step_N`, resumable) and their restore.

Evaluation generates greedily with the rollout's HF engine into which the current weights are
copied (LoRA merged; gathered from the shards under FSDP), and scores with the job's reward, as
`rlfleet eval` does. Rank 0 alone writes: metrics.jsonl, progress lines, eval reports and the final
HF folder `model/`, which `rlfleet run` (model.path) and `rlfleet eval` (--model) take.
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch

from rlfleet.algorithm import AlgorithmConfig
from rlfleet.config import JobConfig
from rlfleet.data.sft import SftExample, batch_for_step
from rlfleet.types import SamplingParams, TrainBatch, TrainSample

log = structlog.get_logger(__name__)

# Supervised learning as a learner update: -logp of every response token, averaged over the step's tokens.
SFT_ALGORITHM = AlgorithmConfig(name="grpo", policy_loss="nll", loss_agg="token-mean", kl_coef=0.0,
                                off_policy="none", entropy_coef=0.0, mini_batches=1, ppo_epochs=1)


@dataclass(frozen=True)
class SftPlan:
    output: Path
    model_path: Path
    examples: list[SftExample]
    batch_size: int
    max_steps: int
    eval_every: int  # 0: evaluate only after the last step (when there is validation data)
    save_every: int  # 0: checkpoint only after the last step
    val_files: list[Path]
    prompt_key: str
    max_length: int

    @property
    def steps_per_epoch(self) -> float:
        return len(self.examples) / self.batch_size


def sft_samples(examples: list[SftExample], version: int) -> list[TrainSample]:
    """Train samples whose loss under `nll` is the responses' cross-entropy (behaviour log-probs unused)."""
    return [TrainSample(prompt_ids=e.prompt_ids, response_ids=e.response_ids,
                        behaviour_logprobs=[0.0] * len(e.response_ids), advantage=1.0,
                        generation_version=version, loss_mask=e.response_mask) for e in examples]


def progress_line(m: dict[str, Any], max_steps: int) -> str:
    line = (f"sft step {m['step']:>4}/{max_steps} | epoch {m['epoch']:.2f} | loss {m['sft/loss']:.4f} "
            f"| lr {m['actor/lr']:.2e} | grad_norm {m['actor/grad_norm']:.3f} "
            f"| {m['perf/tokens_per_s']:.0f} tok/s")
    accuracy = m.get("val/accuracy")
    return line + (f" | val accuracy {accuracy:.4f}" if accuracy is not None else "")


class SftTrainer:
    """`world`: the learner's torchrun world (services.learner.distributed.LearnerWorld), or None."""

    def __init__(self, cfg: JobConfig, plan: SftPlan, world=None):
        from rlfleet.devices import resolve_device, resolve_dtype

        self.cfg, self.plan, self.world = cfg, plan, world
        self.rank0 = world is None or world.rank == 0
        self.device = world.device if world is not None else resolve_device(cfg.learner.device)
        self.dtype = resolve_dtype(cfg.model.dtype, self.device)
        self.learner = self._build_learner()
        self.engine = self.scorer = self.prompts = None
        self.metrics_path = plan.output / "metrics.jsonl"

    def _build_learner(self):
        kwargs = dict(seed=self.cfg.run.seed, algorithm=SFT_ALGORITHM,
                      max_response_tokens=self.plan.max_length, total_steps=self.plan.max_steps)
        args = (self.cfg.learner, self.plan.model_path, self.device, self.dtype,
                self.plan.output / "checkpoints")
        if self.world is not None:
            from services.learner.fsdp import ShardedLearner

            return ShardedLearner(*args, **kwargs)
        from services.learner.learner import Learner

        return Learner(*args, **kwargs)

    # ---- resume ---------------------------------------------------------------------------
    def resume(self, spec: str | None) -> int:
        """Restores the checkpoint `spec` names (latest, auto, a path) and returns its step (0: fresh)."""
        from services.learner.checkpoint import resolve_checkpoint, restore_learner

        checkpoint = resolve_checkpoint(self.plan.output / "checkpoints", spec)
        if checkpoint is None:
            if spec == "auto" and self.rank0:  # a fresh start: the stopped run's lines would mix with its own
                from controller.state import truncate_jsonl

                dropped = truncate_jsonl(self.metrics_path, -1)
                if dropped:
                    print(f"rlfleet: no checkpoint to resume from: sft starts fresh ({dropped} earlier "
                          f"metric line{'s' if dropped > 1 else ''} dropped)", flush=True)
            return 0
        if self.world is not None:
            meta = self.learner.restore(checkpoint, verified=True)
        else:
            meta = restore_learner(self.learner, checkpoint, verified=True)
        step = int(meta["step"])
        if self.rank0:
            from controller.state import truncate_jsonl

            dropped = truncate_jsonl(self.metrics_path, step)
            print(f"rlfleet: sft resumed from {checkpoint} (step {step}"
                  f"{f'; {dropped} later metric lines dropped' if dropped else ''})", flush=True)
        return step

    # ---- training -------------------------------------------------------------------------
    def train(self, start_step: int, stop: threading.Event | None = None) -> bool:
        """Trains from `start_step` to plan.max_steps; True when it got there. `stop` set (Ctrl-C): it
        ends after the step under way, whose checkpoint it writes, and returns False."""
        plan = self.plan
        stop = stop or threading.Event()
        if start_step == 0 and plan.eval_every > 0 and not stop.is_set():
            val = self._evaluate(0)
            if val:
                self._record({"step": 0, "policy_version": 0, "epoch": 0.0, **val}, progress=False)
        saved = start_step
        for step in range(start_step + 1, plan.max_steps + 1):
            if stop.is_set():
                self._stopped(saved, step - 1)
                return False
            batch = batch_for_step(plan.examples, plan.batch_size, step, self.cfg.run.seed)
            started = time.perf_counter()
            samples = sft_samples(batch, self.learner.version)
            result = self.learner.train(TrainBatch(step=step, samples=samples))
            seconds = time.perf_counter() - started
            tokens = sum(len(e.prompt_ids) + len(e.response_ids) for e in batch)
            m = {"step": step, "policy_version": result.policy_version, "epoch": step / plan.steps_per_epoch,
                 "sft/loss": result.metrics["actor/pg_loss"], "actor/lr": result.metrics["actor/lr"],
                 "actor/grad_norm": result.metrics["actor/grad_norm"],
                 "actor/entropy": result.metrics.get("actor/entropy", 0.0),
                 "sft/response_tokens": result.metrics["learner/trained_tokens"],
                 "sft/samples": float(len(batch)),
                 "timing/train_s": seconds, "perf/tokens_per_s": tokens / max(seconds, 1e-9)}
            last = step == plan.max_steps
            if plan.save_every and step % plan.save_every == 0 or last:
                self.learner.save_checkpoint(step)
                saved = step
            if (plan.eval_every and step % plan.eval_every == 0) or last:
                m.update(self._evaluate(step))
            self._record(m)
        if stop.is_set() and saved < plan.max_steps:  # stopped during the last step's evaluation
            self._stopped(saved, plan.max_steps)
            return False
        return True

    def _stopped(self, saved: int, done: int) -> None:
        """Ctrl-C after step `done` (0: none finished): its checkpoint, unless written already."""
        path = self.plan.output / "checkpoints" / f"step_{done}"
        if done > saved:
            path = self.learner.save_checkpoint(done)
        if not self.rank0:
            return
        if done == 0:
            print("rlfleet: sft stopped before its first step; nothing to checkpoint", flush=True)
        else:
            print(f"rlfleet: sft stopped after step {done}: checkpoint {path} written; --resume latest "
                  "continues it", flush=True)

    def _record(self, m: dict[str, Any], progress: bool = True) -> None:
        if not self.rank0:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(m) + "\n")
        if progress:
            print(progress_line(m, self.plan.max_steps), flush=True)

    # ---- evaluation -----------------------------------------------------------------------
    def _full_weights(self) -> dict[str, torch.Tensor]:
        """The policy's whole weights under the plain model's names (rank 0; a collective under FSDP)."""
        if self.world is None:
            return dict(self.learner.named_weights())
        from services.learner.fsdp import full_tensor

        with self.learner._lock:
            gathered = [(name, full_tensor(t.detach())) for name, t in self.learner.named_weights()]
        return dict(gathered) if self.rank0 else {}

    def _evaluate(self, step: int) -> dict[str, float]:
        if not self.plan.val_files:
            return {}
        weights = self._full_weights()  # every rank takes part in the gathers
        metrics: dict[str, float] = {}
        if self.rank0:
            metrics = self._evaluate_on_rank0(step, weights)
        if self.world is not None:
            import torch.distributed as dist

            dist.barrier()  # the other ranks wait while rank 0 generates
        return metrics

    def _evaluate_on_rank0(self, step: int, weights: dict[str, torch.Tensor]) -> dict[str, float]:
        from rlfleet.app.eval_command import reward_rules
        from rlfleet.eval.report import format_table, write_report
        from rlfleet.eval.runner import run_eval
        from rlfleet.eval.scoring import flat_metrics, summarize

        if self.engine is None:
            self._start_evaluation()
        self.engine.apply_weights(weights, step)
        rollout = self.cfg.rollout
        params = SamplingParams(n=1, temperature=0.0, top_p=rollout.top_p, top_k=rollout.top_k,
                                max_new_tokens=rollout.max_new_tokens, stop=tuple(rollout.stop),
                                seed=self.cfg.run.seed)
        samples = run_eval(self.prompts, self.engine.generate, self.scorer.score, params,
                           prompts_per_request=max(1, rollout.max_batch_sequences))
        summary = summarize(samples, 1)
        for src, rule in reward_rules(self.cfg, list(summary["by_source"])).items():
            summary["by_source"][src]["rule"] = rule
        write_report(self.plan.output / "eval" / f"step_{step}.json", summary, samples,
                     {"step": step, "data": [str(f) for f in self.plan.val_files],
                      "params": {"n": 1, "temperature": 0.0, "max_new_tokens": params.max_new_tokens}})
        print(f"rlfleet: sft evaluation at step {step}\n{format_table(summary)}", flush=True)
        return flat_metrics(summary)

    def _start_evaluation(self) -> None:
        from rlfleet.app.eval_command import reward_scorer
        from rlfleet.data.prompts import load_prompts
        from rlfleet.models.context import resolve_prompt_length
        from services.rollout.engines.hf import HFEngine

        rollout = self.cfg.rollout
        self.scorer = reward_scorer(self.cfg)
        self.engine = HFEngine(self.plan.model_path, self.device, self.dtype,
                               rollout.max_batch_sequences, rollout.hf_decode, rollout.cuda_graphs,
                               rollout.compile_decode)
        max_prompt = resolve_prompt_length(self.cfg.data.max_prompt_length, rollout.max_new_tokens,
                                           self.plan.model_path, str(self.plan.model_path))
        self.prompts, too_long = load_prompts(self.plan.val_files, self.engine.tokenizer,
                                              self.plan.prompt_key, max_prompt)
        if too_long:
            print(f"rlfleet: {too_long} validation prompts longer than {max_prompt} tokens left out",
                  flush=True)

    # ---- the result -----------------------------------------------------------------------
    def save_model(self) -> Path | None:
        """The trained policy as a plain HF folder `model/` (LoRA merged), written atomically by rank 0."""
        from transformers import AutoModelForCausalLM

        from rlfleet.weights.receiver import apply_to_module

        weights = self._full_weights()
        final = self.plan.output / "model"
        if self.rank0:
            model = AutoModelForCausalLM.from_pretrained(self.plan.model_path, dtype=self.dtype)
            apply_to_module(model, {k: v.detach().to("cpu") for k, v in weights.items()}, strict=True)
            tmp = self.plan.output / "model.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp, safe_serialization=True)
            self.learner.tokenizer.save_pretrained(tmp)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        if self.world is not None:
            import torch.distributed as dist

            dist.barrier()
        return final if self.rank0 else None

    def close(self) -> None:
        if self.scorer is not None and hasattr(self.scorer, "close"):
            self.scorer.close()
