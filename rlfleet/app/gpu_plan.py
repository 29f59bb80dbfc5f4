"""Applies rlfleet.memory_plan to a service about to load its model on a GPU: which roles share the
GPU, each role's share, the estimate checked against it, and the allocator capped at it."""
from __future__ import annotations

import json
from pathlib import Path

import structlog

from rlfleet.config import JobConfig, LearnerConfig, RolloutConfig
from rlfleet.errors import ConfigError
from rlfleet.memory_plan import (GIB, MAX_SHARES, Shape, Shares, check, largest_micro_batch, learner_bytes,
                                 resolve_shares, rollout_bytes)

log = structlog.get_logger(__name__)
#: the prompt length the rollout's plan assumes when data.max_prompt_length is not set
ASSUMED_PROMPT_TOKENS = 1024


def roles_share_gpu(cfg: JobConfig, gpus: int) -> bool:
    """Whether a local rollout replica and the learner land on one GPU (rlfleet run's placement:
    replica i takes GPU i, the learner the one after the replicas, modulo the GPU count)."""
    if gpus == 0 or cfg.rollout.address or cfg.rollout.addresses:
        return False
    rollout_gpus = {_index(cfg.rollout.device, i, gpus) for i in range(cfg.rollout.replicas)}
    return _index(cfg.learner.device, cfg.rollout.replicas, gpus) in rollout_gpus - {None}


def _index(spec: str, prefer: int, gpus: int) -> int | None:
    if spec == "auto":
        return prefer % gpus
    if spec.startswith("cuda"):
        return int(spec.partition(":")[2] or 0)
    return None


def _model_shape(model_path: Path) -> Shape:
    try:
        return Shape.from_config(json.loads((model_path / "config.json").read_text()))
    except OSError as exc:
        raise ConfigError(f"model.path: cannot read {model_path / 'config.json'} ({exc.strerror})") from None


ROLLOUT_KEY, LEARNER_KEY = "rollout.gpu_memory_utilization", "learner.gpu_memory_utilization"
ROLLOUT_HINTS = "rollout.max_batch_sequences, rollout.max_new_tokens or data.max_prompt_length"
LEARNER_HINTS = ("learner.micro_batch_tokens, or set learner.gradient_checkpointing=true / "
                 "learner.logprob_chunk_tokens")


def rollout_need(cfg: JobConfig, shape: Shape | None, dtype_bytes: int) -> dict[str, int] | None:
    """The rollout's estimate by part; None for an engine that sizes its own memory (vLLM), whose
    shape is not needed (None)."""
    if cfg.rollout.backend != "hf" or shape is None:
        return None
    prompt = cfg.data.max_prompt_length or ASSUMED_PROMPT_TOKENS
    return rollout_bytes(shape, dtype_bytes, cfg.rollout.max_batch_sequences,
                         prompt + cfg.rollout.max_new_tokens)


def job_shares(cfg: JobConfig, shape: Shape | None, dtype_bytes: int, gpu_bytes: int, shared: bool,
               learner_share: float | None = None) -> Shares:
    """The two shares of this job, the same in the rollout's and the learner's process (both derive
    them from the whole job and the one GPU's size). A rollout whose estimate exceeds what both roles
    may take together is refused here, naming its keys: no share could hold it beside a learner."""
    need = rollout_need(cfg, shape, dtype_bytes)
    if shared and need is not None and cfg.rollout.gpu_memory_utilization is None:
        check("the rollout", need, MAX_SHARES, gpu_bytes, ROLLOUT_KEY, ROLLOUT_HINTS,
              why="the most it can take beside the learner", can_raise=False)
    learner_share = cfg.learner.gpu_memory_utilization if learner_share is None else learner_share
    return resolve_shares(cfg.rollout.gpu_memory_utilization, learner_share, shared,
                          None if need is None else sum(need.values()), gpu_bytes)


def _why(share_set: float | None, shares: Shares) -> str:
    return "" if share_set is not None else f"unset, from the memory plan: {shares.why}"


def rollout_plan(cfg: JobConfig, shape: Shape | None, dtype_bytes: int, gpu_bytes: int,
                 shared: bool) -> tuple[Shares, dict[str, int] | None]:
    """The shares and the rollout's estimate, checked against its share (ConfigError naming the keys)."""
    shares = job_shares(cfg, shape, dtype_bytes, gpu_bytes, shared)
    need = rollout_need(cfg, shape, dtype_bytes)
    if need is not None:
        check("the rollout", need, shares.rollout, gpu_bytes, ROLLOUT_KEY, ROLLOUT_HINTS,
              why=_why(cfg.rollout.gpu_memory_utilization, shares))
    return shares, need


def learner_plan(cfg: JobConfig, learner_cfg: LearnerConfig, shape: Shape, dtype_bytes: int, gpu_bytes: int,
                 shared: bool) -> tuple[Shares, LearnerConfig, dict[str, int]]:
    """The shares, the learner's settings with an unset micro-batch chosen to fit its share, and its
    estimate, checked against the share (ConfigError naming the keys)."""
    shares = job_shares(cfg, shape, dtype_bytes, gpu_bytes, shared, learner_cfg.gpu_memory_utilization)
    chunk = learner_cfg.forward_layout(on_gpu=True)[0]
    learner_cfg = with_micro_batch(learner_cfg, shape, dtype_bytes, shares.learner * gpu_bytes, chunk)
    need = learner_bytes(shape, dtype_bytes, learner_cfg.micro_batch_tokens_on(on_gpu=True),
                         learner_cfg.gradient_checkpointing, chunk,
                         learner_cfg.master_weights_on(dtype_bytes))
    check("the learner", need, shares.learner, gpu_bytes, LEARNER_KEY, LEARNER_HINTS,
          why=_why(learner_cfg.gpu_memory_utilization, shares))
    return shares, learner_cfg, need


def plan_rollout(cfg: JobConfig, device, model_path: Path, dtype) -> RolloutConfig:
    """The rollout's settings with its share resolved; on a shared GPU its allocator is capped."""
    if device.type != "cuda":
        return cfg.rollout
    import torch

    shared = roles_share_gpu(cfg, torch.cuda.device_count())
    total = torch.cuda.get_device_properties(device).total_memory
    shape = _model_shape(model_path) if cfg.rollout.backend == "hf" else None  # vLLM sizes itself
    shares, need = rollout_plan(cfg, shape, torch.finfo(dtype).bits // 8, total, shared)
    if need is not None:
        if shared:
            torch.cuda.set_per_process_memory_fraction(shares.rollout, device)
        log.info("rollout GPU memory plan", shared_with_learner=shared, share=shares.rollout,
                 learner_share=shares.learner, why=shares.why,
                 budget_gib=round(shares.rollout * total / GIB, 1),
                 estimate_gib=round(sum(need.values()) / GIB, 1))
    return cfg.rollout.model_copy(update={"gpu_memory_utilization": shares.rollout})


def plan_learner(cfg: JobConfig, learner_cfg: LearnerConfig, device, model_path: Path,
                 dtype) -> LearnerConfig:
    """The learner's settings with its micro-batch resolved, checked against its share; on a shared GPU
    its allocator is capped. An unset learner.micro_batch_tokens becomes the largest size that fits the
    share (logged); a size the user set that does not fit is refused, naming the keys."""
    if device.type != "cuda":
        return learner_cfg
    import torch

    shared = roles_share_gpu(cfg, torch.cuda.device_count())
    total = torch.cuda.get_device_properties(device).total_memory
    shares, learner_cfg, need = learner_plan(cfg, learner_cfg, _model_shape(model_path),
                                             torch.finfo(dtype).bits // 8, total, shared)
    if shared:
        torch.cuda.set_per_process_memory_fraction(shares.learner, device)
    log.info("learner GPU memory plan", shared_with_rollout=shared, share=shares.learner,
             rollout_share=shares.rollout, why=shares.why, budget_gib=round(shares.learner * total / GIB, 1),
             estimate_gib=round(sum(need.values()) / GIB, 1),
             micro_batch_tokens=learner_cfg.micro_batch_tokens)
    return learner_cfg


def with_micro_batch(learner_cfg: LearnerConfig, shape: Shape, dtype_bytes: int, budget_bytes: float,
                     logprob_chunk_tokens: int) -> LearnerConfig:
    """learner_cfg with an unset micro_batch_tokens replaced by the largest size that fits the budget
    (left unset when none does: the check then refuses the default with its sizes)."""
    if learner_cfg.micro_batch_tokens is not None:
        return learner_cfg
    chosen = largest_micro_batch(shape, dtype_bytes, budget_bytes, learner_cfg.gradient_checkpointing,
                                 logprob_chunk_tokens, learner_cfg.master_weights_on(dtype_bytes))
    if chosen is None:
        return learner_cfg
    log.info("learner micro-batch chosen by the memory plan", micro_batch_tokens=chosen,
             budget_gib=round(budget_bytes / GIB, 1),
             hint="set learner.micro_batch_tokens to choose it yourself")
    return learner_cfg.model_copy(update={"micro_batch_tokens": chosen})
