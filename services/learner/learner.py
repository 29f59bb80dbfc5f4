"""The learner core: policy model, optimizer, one policy version per train batch, weight push.

No gRPC here: tests and benchmarks drive `Learner` directly.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import structlog
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfleet.algorithm import AlgorithmConfig
from rlfleet import host_memory
from rlfleet.config import LearnerConfig
from rlfleet.devices import transfer_device, weight_backend, weight_checksums
from rlfleet.errors import VersionMismatch
from rlfleet.profiling import StepProfiler
from rlfleet.types import TrainBatch, TrainResult
from rlfleet.weights import WeightGroup, WeightSender
from rlfleet.weights.digest import weights_digest
from rlfleet.weights.ipc import IpcWeightSender
from services.learner.batching import validate_samples
from services.learner.compile import compile_layers
from services.learner.checkpoint import remove_stale_temporaries, save_checkpoint
from services.learner.flops import dense_bf16_peak_flops, matmul_weights, mfu, train_flops
from services.learner.fused_kernels import apply_fused_kernels
from services.learner.lora import apply_lora, policy_weights
from services.learner.master_weights import build_adamw
from services.learner.memory_metrics import StepMemory
from services.learner.schedule import build_lr_scheduler, warmup_steps
from services.learner.step_results import StepResults
from services.learner.update import build_policy_update
from services.learner.weight_groups import HostedGroup, WeightGroups

log = structlog.get_logger(__name__)


def _alone(wait_s: float) -> AbstractContextManager:
    """No service around the learner (tests, benchmarks): nothing else pushes at the same time."""
    return nullcontext()


class Learner:
    gpus_per_step = 1  # GPUs that share one train step (the sharded learner: its world size)

    def __init__(self, cfg: LearnerConfig, model_path: Path, device: torch.device, dtype: torch.dtype,
                 checkpoint_dir: Path, seed: int = 0, algorithm: AlgorithmConfig | None = None,
                 max_response_tokens: int = 512, total_steps: int = 1):
        self.cfg = cfg
        self.total_steps = total_steps  # the job's controller.max_steps: the LR schedule's length
        self.algorithm = algorithm or AlgorithmConfig()
        self.device = device
        self.checkpoint_dir = checkpoint_dir
        for stale in remove_stale_temporaries(checkpoint_dir):  # left by a learner killed while saving
            log.warning("removed the half-written checkpoint of a learner that died saving", path=str(stale))
        torch.manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
        fused = apply_fused_kernels(base, cfg.fused_kernels, device)
        if cfg.gradient_checkpointing:
            # Non-reentrant: works with inputs that need no grad (frozen embeddings under LoRA) and
            # with the chunked lm_head, and is the variant torch recommends.
            # (transformers >= 5.2x renamed gradient_checkpointing_enable; same torch checkpoint underneath.)
            enable = getattr(base, "activation_checkpointing_enable", None)
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = apply_lora(base, cfg.lora)
        self.model.train()
        if cfg.compile_on(device.type == "cuda"):
            if fused == "liger":  # dynamo cannot trace Liger's RMSNorm: compiling would fail, then run eager
                log.info("learner.compile_skipped",
                         reason="learner.fused_kernels=liger: torch.compile cannot trace Liger's kernels, "
                         "which fuse the same elementwise work; learner.fused_kernels=none compiles instead")
            else:
                compile_layers(self.model, device)
        self.optimizer = build_adamw(  # float32 master weights under 16-bit ones (master_weights.py)
            [p for p in self.model.parameters() if p.requires_grad],
            master_weights=cfg.master_weights_on(torch.finfo(dtype).bits // 8),
            lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=device.type == "cuda")
        self.scheduler = self._lr_scheduler()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.max_seq_len = getattr(self.model.config, "max_position_embeddings", None)
        # The algorithm's pieces (reference, critic, losses) live in update.py; see docs/algorithms.md.
        self.update = build_policy_update(self.model, self.optimizer, self.algorithm, cfg,
                                          model_path=model_path,
                                          device=device, dtype=dtype, pad_id=self.pad_id,
                                          max_response_tokens=max_response_tokens)
        self.version = 0
        self.step = 0
        on_gpu = device.type == "cuda"
        self._peak_flops = dense_bf16_peak_flops(torch.cuda.get_device_name(device)) if on_gpu else None
        self._matmul_weights = matmul_weights(self.model)
        self._lock = threading.Lock()  # a train step and a weight push never overlap
        self.step_results = StepResults()  # a repeated Train gets its stored result (Train is retried)
        self._profiler = StepProfiler("learner")  # RLFLEET_PROFILE_STEPS (rlfleet/profiling.py)
        # Every group opened, by address; a push names its own (services/learner/weight_groups.py).
        self.weight_groups = WeightGroups()

    # ---- training -------------------------------------------------------------------------
    def train(self, batch: TrainBatch) -> TrainResult:
        validate_samples(batch.samples, self.max_seq_len)
        with self._lock:
            repeat = self.step_results.lookup(batch)
            if repeat is not None:
                log.warning("train step repeated; returning its stored result, training nothing",
                            step=batch.step, expected_version=batch.expected_version)
                return repeat
            if batch.expected_version >= 0 and batch.expected_version != self.version:
                raise VersionMismatch(f"train step {batch.step} expected policy version "
                                      f"{batch.expected_version}, learner is at {self.version}")
            start, memory = time.perf_counter(), StepMemory.start(self.device)
            with self._profiler.trace(batch.step):
                metrics = self._optimizer_step(batch)
            self.scheduler.step()  # once per policy version, whatever the mini-batches inside the step
            self.version += 1
            self.step = batch.step
            metrics["timing/learner_step_s"] = time.perf_counter() - start
            metrics.update(self._gpu_metrics(batch, metrics["timing/learner_step_s"], memory))
            result = TrainResult(policy_version=self.version, metrics=metrics)
            self.step_results.record(batch, result)
            if self.device.type == "cpu":  # its freed activations are host memory (rlfleet/host_memory.py)
                host_memory.step_done()
            return result

    def _gpu_metrics(self, batch: TrainBatch, seconds: float, memory: StepMemory | None) -> dict[str, float]:
        """The step's memory (memory_metrics.py) and MFU (flops.py), on a GPU; nothing elsewhere."""
        metrics = memory.finish() if memory is not None else {}
        if self._peak_flops is not None:
            lengths = [len(s.prompt_ids) + len(s.response_ids) for s in batch.samples]
            flops = self.algorithm.ppo_epochs * train_flops(self.model.config, lengths, self._matmul_weights)
            metrics["perf/learner_mfu"] = mfu(flops, seconds, self._peak_flops * self.gpus_per_step)
        return metrics

    def _lr_scheduler(self) -> torch.optim.lr_scheduler.LambdaLR:
        cfg = self.cfg
        warmup = warmup_steps(self.total_steps, cfg.lr_warmup_steps, cfg.lr_warmup_ratio)
        return build_lr_scheduler(self.optimizer, kind=cfg.lr_scheduler, total_steps=self.total_steps,
                                  warmup_steps_=warmup, min_lr_ratio=cfg.min_lr_ratio)

    def _optimizer_step(self, batch: TrainBatch) -> dict[str, float]:
        return self.update.run(batch)

    # ---- weights --------------------------------------------------------------------------
    def open_weight_group(self, world_size: int, host: str, timeout_s: float,
                          token: str | None = None, members: list[str] | None = None) -> tuple[str, str]:
        """`token`: only ranks that present it are admitted (rlfleet.weights.group); `members`:
        where each member's weights live (rlfleet.devices.placement), which picks the transport.
        Takes no lock of the model's: hosting a store waits for nothing, so an Open (anyone's, without
        a token) never makes a step or a push wait, and it replaces no group (weight_groups.py)."""
        backend = weight_backend(self.cfg.weight_backend, self.device, members)
        checksums = weight_checksums(self.cfg.weight_checksums, backend)
        group = WeightGroup.host(world_size=world_size, backend="gloo" if backend == "ipc" else backend,
                                 host=host, timeout_s=timeout_s,
                                 device=transfer_device(backend, self.device), token=token)
        if backend == "ipc":
            sender = IpcWeightSender(group, self.device, checksums=checksums)
        else:
            sender = WeightSender(group, bucket_bytes=self.cfg.weight_bucket_mb << 20, checksums=checksums)
        self.weight_groups.add(HostedGroup(group, sender, backend))
        log.info("weight group transport", backend=backend, requested=self.cfg.weight_backend,
                 members=world_size - 1, learner_device=str(self.device), address=group.address)
        return group.address, backend

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The weights a rollout copy of the model must hold (rlfleet.weights.naming; LoRA merged)."""
        return policy_weights(self.model)

    def push_weights(self, version: int, digest: bool = False, group: str = "",
                     exclusive: Callable[[float], AbstractContextManager] | None = None,
                     ) -> dict[str, float | str]:
        """Pushes `version` to the group at address `group` (empty: the one opened last).

        The rendezvous (every rank of the group arriving) holds nothing of the learner's: neither the
        model's lock nor `exclusive` (the service's one weight operation at a time, entered with the
        group's time left once its ranks are all there). Anyone may open a group and push to it when no
        token is set; such a push waits for ranks that never come, and while it held the learner the
        run's own push was refused and its rollouts' pulls waited out their timeout (issue 42)."""
        hosted = self.weight_groups.take(group)
        outcome = "untouched"
        try:
            if version != self.version:
                raise VersionMismatch(f"push of version {version} asked, learner is at {self.version}")
            start = time.perf_counter()
            outcome = "failed"  # from here the ranks may wait for a transfer: a failure closes the group
            with hosted.group.bounded():  # one group timeout for the whole push (issue 32)
                hosted.group.connect()
                with (exclusive or _alone)(hosted.group.time_left()), self._lock:
                    if version != self.version:  # a step ran during the rendezvous
                        raise VersionMismatch(f"push of version {version} asked, the learner moved on to "
                                              f"{self.version} while the group's ranks arrived")
                    stats = hosted.sender.push(self.named_weights(), version)
                    outcome = "pushed"
                    stats["seconds"] = time.perf_counter() - start
                    if digest:
                        stats["digest"] = weights_digest(self.named_weights())
            return stats
        finally:
            self.weight_groups.done(hosted, outcome)

    def abort_weight_group(self, group: str, reason: str) -> bool:
        """Ends the push to the group at address `group` at once (the controller saw a member fail
        inside the sync): it fails naming `reason` instead of waiting out the group's timeout for that
        member, and the group is closed. Takes no lock: it must reach a push that holds them. Returns
        whether a push was on the group; a group not held here (or nobody pushing) is no error."""
        pushing = self.weight_groups.abort(group, reason)
        log.info("weight group aborted", address=group, pushing=pushing, reason=reason)
        return pushing

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> Path:
        with self._lock:
            return save_checkpoint(self.checkpoint_dir, step, self.model, self.tokenizer, self.optimizer,
                                   {"policy_version": self.version},
                                   critic=getattr(self.update, "critic", None),
                                   scheduler=getattr(self, "scheduler", None))

