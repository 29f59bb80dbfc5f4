"""Validation during training: every `controller.eval_every` steps, on `data.val_files`.

Generation goes to the rollout service (which serves the policy just pushed)
and scoring to the same reward path as training, through `rlfleet.eval`, so the
numbers are those `rlfleet eval` would give for the checkpoint of that step.
Metrics: `val/<data_source>/accuracy`, `.../reward/mean`, `.../response_length/mean`,
`.../pass@k` (eval_n > 1), the same over all sources as `val/...`, and
`timing/eval_s`, with the majority-answer baseline, answer diversity, clipped share and NLL of
rlfleet/eval/scoring.py. Each evaluation prints `rlfleet eval`'s table (rlfleet/eval/report.py).
Samples are appended to `samples/val.jsonl`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import structlog

from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, load_prompts
from rlfleet.env.tool_prompt import ToolPrompt
from rlfleet.data.tasks import write_parquet
from rlfleet.eval.report import format_table, sample_texts
from rlfleet.eval.runner import GenerateFn, ScoreFn, run_eval
from rlfleet.eval.scoring import flat_metrics, summarize
from rlfleet.types import SamplingParams

log = structlog.get_logger(__name__)

BUILTIN_VAL_SIZE = 64  # held-out prompts of the built-in task when no val_files are given


def val_files(cfg: JobConfig) -> list[Path]:
    """data.val_files, or a held-out split of the built-in task when training on it."""
    if cfg.data.val_files:
        return [Path(f) for f in cfg.data.val_files]
    if cfg.data.train_files:
        return []
    path = cfg.run.dir / "data" / "builtin_val.parquet"
    if not path.exists():
        write_parquet(path, BUILTIN_VAL_SIZE, cfg.run.seed, split="test")
    return [path]


class PeriodicEval:
    def __init__(self, cfg: JobConfig, prompts: list[Prompt], samples_path: Path | None = None):
        cc = cfg.controller
        self.every = cc.eval_every
        self.last_step = cc.max_steps
        self.before_train = cc.eval_before_train
        self.prompts = prompts
        self.params = SamplingParams(
            n=cc.eval_n,
            temperature=0.0 if cc.eval_n == 1 else cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            max_new_tokens=cfg.rollout.max_new_tokens,
            stop=tuple(cfg.rollout.stop),
        )
        self.per_request = cc.prompts_per_request
        self.samples_path = samples_path
        self.episodes = cfg.env.enabled  # validate as trained: multi-turn episodes with the environment
        self.texts: dict[str, str] = {}  # a few samples of the last evaluation, for TensorBoard's text tab

    @classmethod
    def from_config(cls, cfg: JobConfig, tokenizer: Any, max_prompt_length: int,
                    tools: ToolPrompt | None = None) -> PeriodicEval | None:
        if cfg.controller.eval_every == 0:
            return None
        files = val_files(cfg)
        if not files:
            log.warning("controller.eval_every is set but data.val_files is empty: no validation")
            return None
        prompts, too_long = load_prompts(files, tokenizer, cfg.data.prompt_key, max_prompt_length, tools)
        log.info("validation prompts loaded", count=len(prompts), filtered_too_long=too_long)
        if too_long:
            print(f"rlfleet: {too_long} validation prompts left out, longer than data.max_prompt_length="
                  f"{max_prompt_length} tokens", flush=True)
        return cls(cfg, prompts, cfg.run.dir / "samples" / "val.jsonl")

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.last_step

    def run(self, step: int, version: int, generate: GenerateFn, score: ScoreFn) -> dict[str, float]:
        start = time.perf_counter()
        samples = run_eval(self.prompts, generate, score, self.params, self.per_request,
                           episodes=self.episodes)
        summary = summarize(samples, self.params.n)
        self.texts = {f"val/{src}/samples": text for src, text in sample_texts(samples).items()}
        metrics = flat_metrics(summary)
        metrics["timing/eval_s"] = time.perf_counter() - start
        if self.samples_path is not None:
            self.samples_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.samples_path, "a") as f:
                f.writelines(
                    json.dumps({"step": step, "evaluated_version": version, **dataclasses.asdict(s)}) + "\n"
                    for s in samples
                )
        # the table `rlfleet eval` prints, on the console under the step lines
        print(f"rlfleet: validation of policy version {version} at step {step} ({len(self.prompts)} prompts, "
              f"{metrics['timing/eval_s']:.1f}s):\n{format_table(summary)}", flush=True)
        log.info(
            "validation",
            step=step,
            evaluated_version=version,
            accuracy=summary["overall"]["accuracy"],
            seconds=round(metrics["timing/eval_s"], 2),
        )
        return metrics

    def maybe_run(self, step: int, version: int, generate: GenerateFn, score: ScoreFn) -> dict[str, float]:
        """The validation metrics when `step` is due, else {}."""
        return self.run(step, version, generate, score) if self.due(step) else {}
