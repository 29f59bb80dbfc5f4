"""The learner core: policy model, optimizer, one GRPO step per batch, weight push.

No gRPC here: tests and benchmarks drive `Learner` directly.
"""
from __future__ import annotations

import copy
import threading
import time
from collections import defaultdict
from pathlib import Path

import structlog
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfleet.config import LearnerConfig
from rlfleet.devices import transfer_device, weight_backend
from rlfleet.errors import NotReady, VersionMismatch, WeightSyncError
from rlfleet.types import TrainBatch, TrainResult
from rlfleet.weights import WeightGroup, WeightSender
from rlfleet.weights.digest import weights_digest
from services.learner.batching import collate, split_by_token_budget, validate_samples
from services.learner.checkpoint import save_checkpoint
from services.learner.loss import grpo_policy_loss, token_entropy, token_logprobs

log = structlog.get_logger(__name__)


class Learner:
    def __init__(self, cfg: LearnerConfig, model_path: Path, device: torch.device, dtype: torch.dtype,
                 checkpoint_dir: Path, seed: int = 0):
        self.cfg = cfg
        self.device = device
        self.checkpoint_dir = checkpoint_dir
        torch.manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
        self.model.train()
        self.ref_model = None
        if cfg.kl_coef > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
            fused=device.type == "cuda")
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.max_seq_len = getattr(self.model.config, "max_position_embeddings", None)
        self.version = 0
        self.step = 0
        self._lock = threading.Lock()  # a train step and a weight push never overlap
        self._group: WeightGroup | None = None
        self._sender: WeightSender | None = None

    # ---- training -------------------------------------------------------------------------
    def train(self, batch: TrainBatch) -> TrainResult:
        validate_samples(batch.samples, self.max_seq_len)
        with self._lock:
            if batch.expected_version >= 0 and batch.expected_version != self.version:
                raise VersionMismatch(f"train step {batch.step} expected policy version "
                                      f"{batch.expected_version}, learner is at {self.version}")
            start = time.perf_counter()
            metrics = self._optimizer_step(batch)
            self.version += 1
            self.step = batch.step
            metrics["timing/learner_step_s"] = time.perf_counter() - start
            return TrainResult(policy_version=self.version, metrics=metrics)

    def _optimizer_step(self, batch: TrainBatch) -> dict[str, float]:
        total_tokens = sum(len(s.response_ids) for s in batch.samples)
        sums: dict[str, float] = defaultdict(float)
        self.optimizer.zero_grad(set_to_none=True)
        for samples in split_by_token_budget(batch.samples, self.cfg.micro_batch_tokens):
            mb = collate(samples, self.pad_id, self.device)
            logits = self.model(input_ids=mb.input_ids_B_L, attention_mask=mb.attention_mask_B_L).logits
            logits_B_T_V = logits[:, :-1]  # loss functions upcast one row at a time
            logprobs = token_logprobs(logits_B_T_V, mb.targets_B_T, batch.temperature)
            ref_logprobs = self._ref_logprobs(mb, batch.temperature) if self.ref_model is not None else None
            out = grpo_policy_loss(
                logprobs, mb.behaviour_logprobs_B_T, mb.advantages_B, mb.response_mask_B_T,
                clip_low=self.cfg.clip_low, clip_high=self.cfg.clip_high,
                ref_logprobs_B_T=ref_logprobs, kl_coef=self.cfg.kl_coef, normalizer=float(total_tokens))
            out.loss.backward()
            # Metrics are micro-batch token means; weight them by tokens to get batch token means.
            weight = mb.num_tokens / total_tokens
            with torch.no_grad():
                entropy = token_entropy(logits_B_T_V, batch.temperature)
                entropy_mean = (entropy * mb.response_mask_B_T).sum() / max(mb.num_tokens, 1)
            sums["actor/pg_loss"] += float(out.pg_loss) * weight
            sums["actor/kl_loss"] += float(out.kl_loss) * weight
            sums["actor/pg_clipfrac"] += float(out.pg_clipfrac) * weight
            sums["actor/ratio_mean"] += float(out.ratio_mean) * weight
            sums["rollout/logprob_diff_mean"] += float(out.logprob_diff_mean) * weight
            sums["actor/entropy"] += float(entropy_mean) * weight
            sums["learner/micro_batches"] += 1
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        self.optimizer.step()
        sums["actor/grad_norm"] = float(grad_norm)
        sums["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        sums["learner/tokens"] = float(total_tokens)
        return dict(sums)

    @torch.no_grad()
    def _ref_logprobs(self, mb, temperature: float) -> torch.Tensor:
        logits = self.ref_model(input_ids=mb.input_ids_B_L, attention_mask=mb.attention_mask_B_L).logits
        return token_logprobs(logits[:, :-1], mb.targets_B_T, temperature)

    # ---- weights --------------------------------------------------------------------------
    def open_weight_group(self, world_size: int, host: str, timeout_s: float) -> tuple[str, str]:
        with self._lock:
            if self._group is not None:
                self._group.close()
            backend = weight_backend(self.cfg.weight_backend, self.device)
            self._group = WeightGroup.host(world_size=world_size, backend=backend, host=host,
                                           timeout_s=timeout_s, device=transfer_device(backend, self.device))
            self._sender = WeightSender(self._group, bucket_bytes=self.cfg.weight_bucket_mb << 20)
            return self._group.address, backend

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Parameters and buffers: exactly what a rollout copy of the model must hold."""
        return [*self.model.named_parameters(), *self.model.named_buffers()]

    def push_weights(self, version: int, digest: bool = False) -> dict[str, float | str]:
        with self._lock:
            if self._sender is None or self._group is None:
                raise NotReady("no weight group: call OpenWeightGroup first")
            if version != self.version:
                raise VersionMismatch(f"push of version {version} asked, learner is at {self.version}")
            start = time.perf_counter()
            try:
                self._group.connect()
                stats = self._sender.push(self.named_weights(), version)
            except WeightSyncError:
                self._group.close()
                self._group, self._sender = None, None
                raise
            stats["seconds"] = time.perf_counter() - start
            if digest:
                stats["digest"] = weights_digest(self.named_weights())
            return stats

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> Path:
        with self._lock:
            return save_checkpoint(self.checkpoint_dir, step, self.model, self.tokenizer, self.optimizer,
                                   {"policy_version": self.version})

