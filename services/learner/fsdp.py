"""A learner sharded across the ranks of its own torch.distributed world with FSDP2.

Every rank holds a shard of each parameter (``torch.distributed.fsdp.fully_shard`` per decoder
layer, then the root) and of the optimizer state. One Train call is data parallel over
micro-batches: every rank builds the same micro-batches from the whole batch (so the loss
normalizers, which divide by counts of the whole mini-batch, stay global), then runs forward and
backward only on its own share of them (micro-batch ``i`` goes to rank ``i mod world``). FSDP's
reduce-scatter *sums* the gradients (divide factor 1): each rank's loss is already its share of
the global loss, so the summed gradient is the one-process gradient.

FSDP's collectives need every rank to run the same number of forwards and backwards, so a rank
with fewer micro-batches pads with a copy of one whose response mask is all zeros: its loss and
gradient are exactly zero. The no-gradient pass before the update (old log-probs, reference
log-probs) runs on every micro-batch on every rank, so the advantage estimate sees the whole
batch (whitening is over the batch) without any exchange of tensors.

Weights leave the shards only through ``full_weights``-style gathers (``DTensor.full_tensor()``),
one parameter at a time, in an order every rank derives from the same names: the weight push
(rank 0 packs buckets, the others run ``follow_push``), the weight digest and checkpoints.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from rlfleet.errors import ConfigError, WeightSyncError
from rlfleet.weights.digest import weights_digest
from rlfleet.weights.manifest import plan_buckets
from services.learner.algorithms.aggregation import BatchCounts
from services.learner.checkpoint import save_checkpoint
from services.learner.learner import Learner
from services.learner.reference import FrozenCopyReference
from services.learner.update import MAX_METRICS, PolicyUpdate, Prepared, _Means


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a collective: every rank must call it for the same tensor)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_model(model: torch.nn.Module, mesh=None) -> FSDPModule:
    """FSDP2 over each transformer block, then the root (embeddings, norm, head)."""
    blocks = _blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model  # fully_shard changed its class in place


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated decoder blocks: the classes transformers marks as not to be split."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


class ShardedPolicyUpdate(PolicyUpdate):
    """PolicyUpdate whose optimizer steps are data parallel across the learner world."""

    def __init__(self, *args: Any, rank: int, world_size: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rank, self.world_size = rank, world_size

    @classmethod
    def like(cls, update: PolicyUpdate, optimizer: torch.optim.Optimizer, rank: int,
             world_size: int) -> ShardedPolicyUpdate:
        return cls(update.model, optimizer, update.algo, grad_clip=update.grad_clip,
                   micro_batch_tokens=update.micro_batch_tokens, pad_id=update.pad_id, device=update.device,
                   loss_scale_tokens=update.loss_scale_tokens, reference=update.reference,
                   critic=update.critic,
                   rank=rank, world_size=world_size)

    def _share(self, mini: list[Prepared]) -> list[tuple[Prepared, bool]]:
        """This rank's micro-batches, padded with zero-mask copies to the same count on every rank."""
        mine = [(p, True) for p in mini[self.rank::self.world_size]]
        per_rank = math.ceil(len(mini) / self.world_size)
        blank = replace(mini[0], mb=replace(mini[0].mb, response_mask_B_T=torch.zeros_like(
            mini[0].mb.response_mask_B_T)))
        return mine + [(blank, False)] * (per_rank - len(mine))

    def _policy_step(self, mini: list[Prepared], counts: BatchCounts, temperature: float, first_pass: bool,
                     means: _Means) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        tokens: dict[str, float] = {}
        largest: dict[str, float] = {}
        for p, real in self._share(mini):
            metrics = self._backward(p, counts, temperature, first_pass)
            n = p.mb.num_tokens if real else 0
            for key in MAX_METRICS & metrics.keys():
                value = float(metrics.pop(key))
                largest[key] = max(largest.get(key, 0.0), value if n else 0.0)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + (float(value) * n if n else 0.0)
                tokens[key] = tokens.get(key, 0.0) + n
        self._add_global_means(sums, tokens, means)
        self._add_global_maxima(largest, means)
        params = [q for q in self.model.parameters() if q.grad is not None]
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        grad_norm = full_tensor(torch.nn.utils.get_total_norm([q.grad for q in params]))
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, grad_norm)
        self.optimizer.step()
        means.add_step({"actor/grad_norm": float(grad_norm)})

    def _add_global_maxima(self, largest: dict[str, float], means: _Means) -> None:
        """The largest of each MAX_METRICS value over the world (every rank has the same keys)."""
        if not largest:
            return
        keys = sorted(largest)
        both = torch.tensor([largest[k] for k in keys], dtype=torch.float64,
                            device=next(self.model.parameters()).device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        means.add_tokens(dict(zip(keys, both.cpu().tolist())), 0)

    def _add_global_means(self, sums: dict[str, float], tokens: dict[str, float], means: _Means) -> None:
        """Token sums of this rank's micro-batches, summed over the world (every rank has the same keys)."""
        keys = sorted(sums)
        both = torch.tensor([sums[k] for k in keys] + [tokens[k] for k in keys], dtype=torch.float64)
        device = next(self.model.parameters()).device
        both = both.to(device)
        dist.all_reduce(both)
        both = both.cpu().tolist()
        for i, key in enumerate(keys):
            means.token_sums[key] += both[i]
            means.token_counts[key] += both[len(keys) + i]


def check_shardable(learner: Learner) -> None:
    from services.learner.lora import is_lora

    if is_lora(learner.model):
        raise ConfigError("learner.world_size > 1 does not support learner.lora yet (use world_size=1)")
    if learner.update.critic is not None:
        raise ConfigError("learner.world_size > 1 does not support algorithms with a critic (ppo/gae) yet")


class ShardedLearner(Learner):
    """A Learner whose policy (and frozen reference) is sharded over the default process group.

    Every rank constructs one and calls the same methods in the same order (rank 0 driven by the
    gRPC servicer through ``distributed.LearnerFront``, the others by ``worker_loop``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check_shardable(self)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.gpus_per_step = self.world_size  # the step's FLOPs are spread over every rank's GPU (MFU)
        shard_model(self.model)
        for module in self.model.modules():  # sum, not mean: each rank's loss is its share of the global one
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
        if isinstance(self.update.reference, FrozenCopyReference):
            shard_model(self.update.reference.model)
        # The optimizer must hold the sharded parameters (fully_shard replaced them); no step was taken yet.
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=self.cfg.lr, betas=self.cfg.betas,
            weight_decay=self.cfg.weight_decay)
        self.scheduler = self._lr_scheduler()  # on the new optimizer; no step was taken yet
        self.update = ShardedPolicyUpdate.like(self.update, self.optimizer, self.rank, self.world_size)

    # ---- weights --------------------------------------------------------------------------
    def push_weights(self, version: int, digest: bool = False, group: str = "",
                     exclusive: Callable[[float], AbstractContextManager] | None = None,
                     ) -> dict[str, float | str]:
        """Rank 0: the sender gathers each parameter while it packs its bucket (see follow_push).

        When the push fails on the weight group (a rollout died), the other ranks are still
        waiting in the gathers the sender did not reach: rank 0 runs them too, so the learner's
        ranks stay in step and a later push (on a rebuilt weight group) can succeed."""
        sender = self.weight_groups.find(group).sender
        try:
            stats = super().push_weights(version, digest=False, group=group, exclusive=exclusive)
        except WeightSyncError:
            if sender is not None:
                self._gather_from(self.gather_plan(version, sender.bucket_bytes, sender.checksums),
                                  sender.packed)
                if digest:
                    self.weights_digest()
            raise
        if digest:
            stats["digest"] = self.weights_digest()
        return stats

    def follow_push(self, version: int, bucket_bytes: int, checksums: bool, digest: bool) -> None:
        """Ranks > 0: take part in the gathers of rank 0's push, in the order its sender packs."""
        self._gather_from(self.gather_plan(version, bucket_bytes, checksums), 0)
        if digest:
            self.weights_digest()

    def gather_plan(self, version: int, bucket_bytes: int, checksums: bool) -> list[str]:
        """The names WeightSender.push packs, in order: with checksums a pass over every bucket,
        then the broadcast pass over the non-empty ones; each bucket's entries in manifest order."""
        manifest = plan_buckets(self.named_weights(), version, bucket_bytes)
        by_bucket: list[list[str]] = [[] for _ in manifest.buckets]
        for entry in manifest.entries:
            by_bucket[entry.bucket].append(entry.name)
        passes = ([range(len(manifest.buckets))] if checksums else []) + [
            [b for b, spec in enumerate(manifest.buckets) if spec.numel > 0]]
        return [name for buckets in passes for b in buckets for name in by_bucket[b]]

    def _gather_from(self, plan: list[str], done: int) -> None:
        with self._lock:
            tensors = dict(self.named_weights())
            for name in plan[done:]:
                full_tensor(tensors[name])

    def weights_digest(self) -> str:
        """The digest of the full weights (rank 0's answer; every rank takes part in the gathers)."""
        with self._lock:
            full = []
            for name, t in sorted(self.named_weights(), key=lambda item: item[0]):
                whole = full_tensor(t.detach())
                if self.rank == 0:
                    full.append((name, whole))
            return weights_digest(full) if self.rank == 0 else ""

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole state dict on rank 0 (CPU), empty elsewhere; every rank must call it."""
        state = {}
        for name, t in self.model.state_dict().items():
            whole = full_tensor(t.detach())
            if self.rank == 0:
                state[name] = whole.cpu()
        return state

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> Path:
        """Gathers the full model and optimizer state to rank 0, which writes the usual checkpoint."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        with self._lock:
            model_state = self.full_state()
            optim_state = get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True))
            path = self.checkpoint_dir / f"step_{step}"
            if self.rank == 0:
                path = save_checkpoint(self.checkpoint_dir, step, _GatheredModel(self.model, model_state),
                                       self.tokenizer, _GatheredOptimizer(optim_state),
                                       {"policy_version": self.version,
                                        "learner_world_size": self.world_size})
            dist.barrier()  # the others return once the checkpoint exists
            return path

    def restore(self, path: Path, verified: bool = False) -> dict[str, Any]:
        """Loads a checkpoint written by save_checkpoint (on every rank: each keeps its shard).
        `verified`: resolve_checkpoint already checked its files against their digests."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint import state_dict as dcp

        from rlfleet.errors import CheckpointError
        from services.learner.checkpoint import (OPTIMIZER, TRAINER_STATE, read_meta, set_rng_state,
                                                 verify_checkpoint)

        meta = read_meta(path) if verified else verify_checkpoint(path)
        with self._lock:
            state: dict[str, torch.Tensor] = {}
            for shard in sorted(p for p in path.glob("*.safetensors") if not p.name.startswith("adapter_")):
                state.update(load_file(str(shard)))
            if getattr(self.model.config, "tie_word_embeddings", False) and "lm_head.weight" not in state:
                state["lm_head.weight"] = state["model.embed_tokens.weight"]  # save_pretrained leaves it out
            optim = torch.load(path / OPTIMIZER, weights_only=True)
            if any(isinstance(k, int) for k in optim.get("state", {})):
                raise CheckpointError(f"checkpoint {path} was written by a learner with world_size 1; its "
                                      "optimizer state cannot be sharded (start from its weights with a "
                                      "fresh run)")
            full = dcp.StateDictOptions(full_state_dict=True)
            try:
                dcp.set_model_state_dict(self.model, state, options=full)
                dcp.set_optimizer_state_dict(self.model, self.optimizer, optim, options=full)
            except (RuntimeError, KeyError, ValueError) as exc:
                raise CheckpointError(f"checkpoint {path} does not fit this sharded model: {exc}") from None
            if (path / TRAINER_STATE).is_file():
                trainer = torch.load(path / TRAINER_STATE, weights_only=False)
                if "rng" in trainer:
                    set_rng_state(trainer["rng"])
            self.version = int(meta.get("policy_version", meta["step"]))
            self.step = int(meta["step"])
            self.step_results.clear()
        return meta


class _GatheredModel:
    """save_pretrained of a sharded model with its gathered full state dict."""

    def __init__(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        self.model, self.state = model, state

    def save_pretrained(self, path: Path, **kwargs: Any) -> None:
        self.model.save_pretrained(path, state_dict=self.state, **kwargs)


class _GatheredOptimizer:
    """The optimizer state gathered to rank 0 (keyed by parameter names, torch.distributed.checkpoint's
    full-state-dict format)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state
