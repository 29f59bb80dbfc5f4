"""Applies rlfleet.memory_plan to a service about to load its model on a GPU: which roles share the
GPU, each role's share, the estimate checked against it, and the allocator capped at it."""
from __future__ import annotations

import json
from pathlib import Path

import structlog

from rlfleet.config import JobConfig, LearnerConfig, RolloutConfig
from rlfleet.errors import ConfigError
from rlfleet.memory_plan import GIB, Shape, check, largest_micro_batch, learner_bytes, rollout_bytes, shares

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


def plan_rollout(cfg: JobConfig, device, model_path: Path, dtype) -> RolloutConfig:
    """The rollout's settings with its share resolved; on a shared GPU its allocator is capped."""
    if device.type != "cuda":
        return cfg.rollout
    import torch

    gpus = torch.cuda.device_count()
    shared = roles_share_gpu(cfg, gpus)
    share, _ = shares(cfg.rollout.gpu_memory_utilization, cfg.learner.gpu_memory_utilization, shared)
    if cfg.rollout.backend == "hf":
        prompt = cfg.data.max_prompt_length or ASSUMED_PROMPT_TOKENS
        need = rollout_bytes(_model_shape(model_path), torch.finfo(dtype).bits // 8,
                             cfg.rollout.max_batch_sequences, prompt + cfg.rollout.max_new_tokens)
        total = torch.cuda.get_device_properties(device).total_memory
        check("the rollout", need, share, total, "rollout.gpu_memory_utilization",
              "rollout.max_batch_sequences, rollout.max_new_tokens or data.max_prompt_length")
        if shared:
            torch.cuda.set_per_process_memory_fraction(share, device)
        log.info("rollout GPU memory plan", shared_with_learner=shared, share=share,
                 budget_gib=round(share * total / GIB, 1), estimate_gib=round(sum(need.values()) / GIB, 1))
    return cfg.rollout.model_copy(update={"gpu_memory_utilization": share})


def plan_learner(cfg: JobConfig, learner_cfg: LearnerConfig, device, model_path: Path,
                 dtype) -> LearnerConfig:
    """The learner's settings with its micro-batch resolved, checked against its share; on a shared GPU
    its allocator is capped. An unset learner.micro_batch_tokens becomes the largest size that fits the
    share (logged); a size the user set that does not fit is refused, naming the keys."""
    if device.type != "cuda":
        return learner_cfg
    import torch

    shared = roles_share_gpu(cfg, torch.cuda.device_count())
    _, share = shares(cfg.rollout.gpu_memory_utilization, learner_cfg.gpu_memory_utilization, shared)
    shape, dtype_bytes = _model_shape(model_path), torch.finfo(dtype).bits // 8
    chunk = learner_cfg.forward_layout(on_gpu=True)[0]
    total = torch.cuda.get_device_properties(device).total_memory
    learner_cfg = with_micro_batch(learner_cfg, shape, dtype_bytes, share * total, chunk)
    need = learner_bytes(shape, dtype_bytes, learner_cfg.micro_batch_tokens_on(on_gpu=True),
                         learner_cfg.gradient_checkpointing, chunk,
                         learner_cfg.master_weights_on(dtype_bytes))
    check("the learner", need, share, total, "learner.gpu_memory_utilization",
          "learner.micro_batch_tokens, or set learner.gradient_checkpointing=true / "
          "learner.logprob_chunk_tokens")
    if shared:
        torch.cuda.set_per_process_memory_fraction(share, device)
    log.info("learner GPU memory plan", shared_with_rollout=shared, share=share,
             budget_gib=round(share * total / GIB, 1), estimate_gib=round(sum(need.values()) / GIB, 1),
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
