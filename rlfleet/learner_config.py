"""The `learner` section of the job config (rlfleet.config): optimisation, weight sync, memory and speed."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlfleet.algorithm import LoraConfig
from rlfleet.config_sections import ServiceEndpointConfig


class LearnerConfig(ServiceEndpointConfig):
    lr: float = Field(5e-4, gt=0.0, lt=1.0, description="peak learning rate of AdamW (after warmup)")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate decay after warmup, over controller.max_steps (TRL's "
        "lr_scheduler_type): constant, linear or cosine down to min_lr_ratio x lr")
    lr_warmup_steps: int = Field(0, ge=0, description="steps of linear warmup from ~0 to lr; 0: use "
                                 "lr_warmup_ratio")
    lr_warmup_ratio: float = Field(0.0, ge=0.0, le=1.0, description="warmup as a fraction of "
                                   "controller.max_steps (verl's lr_warmup_steps_ratio), when "
                                   "lr_warmup_steps is 0")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="linear/cosine decay ends at this "
                                "fraction of lr")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW beta1, beta2")
    master_weights: bool | None = Field(
        None, description="AdamW steps float32 copies of 16-bit weights (its moments float32 too) and "
        "writes them back rounded, so updates below bfloat16's resolution (~lr < |w| / 512) add up instead "
        "of rounding away; null: on when the policy trains in bfloat16/float16 (a GPU's default), 12 "
        "bytes a parameter more (single-process learner; world_size > 1 steps its shards in their own "
        "dtype); false: AdamW on the 16-bit weights themselves")
    grad_clip: float = Field(1.0, ge=0.0, description="max global grad norm; 0 disables clipping")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="train LoRA adapters of the policy")
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="token budget of one micro-batch (padded length x sequences); null: on a "
        "GPU the largest multiple of 1024 up to 32768 that the memory plan fits in the learner's share "
        "(logged; 4096 where no plan runs: a sharded learner), 1024 on the CPU (a quarter of the activation "
        "memory there, at the same speed); a set value that does not fit is refused")
    checkpoint_every: int = Field(0, ge=0, description="save a checkpoint every N steps; 0 only at the end")
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0, description="share of its GPU's memory the learner may take; null: no cap on a "
        "GPU of its own; on a GPU shared with a rollout, what the rollout's share leaves of 0.95, at most "
        "0.60 (docs/performance.md, one GPU)")
    weight_backend: Literal["auto", "ipc", "nccl", "gloo"] = Field(
        "auto", description="weight-sync transport; auto follows placement: CUDA IPC when the rollouts share "
        "the learner's GPU, NCCL when each has a GPU of its own, else gloo (host memory)")
    weight_checksums: Literal["auto", "on", "off"] = Field(
        "auto", description="per-bucket checksums of each weight push; auto: on for gloo, off for NCCL "
        "and IPC")
    weight_bucket_mb: int = Field(256, ge=1, description="size of one weight-sync bucket")
    weight_sync_timeout_s: float = Field(120.0, gt=0.0, description="a weight push or pull that takes longer "
                                         "is aborted on both sides")
    verify_weights: bool = Field(False, description="after every sync compare digests of the learner's and "
                                 "each rollout's weights; a mismatch stops the run")
    resume_from: str | None = Field(None, description="checkpoint to load at start: a step_N folder, "
                                    "`latest` (the run's newest; an error if none) or `auto` (the newest if "
                                    "any, else fresh)")
    world_size: int = Field(1, ge=1, le=1024, description="learner processes the policy is sharded across "
                            "(FSDP2, data parallel over micro-batches); > 1 runs under torchrun "
                            "(docs/deployment/multi-gpu-learner.md)")

    logprob_chunk_tokens: int | None = Field(
        None, ge=0, description="compute log-probs/entropies through the lm_head this many tokens at a time, "
        "recomputing each chunk's logits in backward, so full-vocabulary logits never exist for the whole "
        "micro-batch; 0 materialises all logits; null: 8192 for a single-process learner on a GPU, else 0")
    pack_sequences: bool | None = Field(
        None, description="pack several samples into one model row (position ids restart per sample, "
        "block-diagonal causal attention) instead of padding; micro_batch_tokens then counts real tokens; "
        "null: on for a single-process learner on a GPU, else off")
    fused_kernels: Literal["none", "liger", "auto"] = Field(
        "none", description="fused Triton kernels for RMSNorm, rotary and SwiGLU from Liger Kernel (liger; "
        "auto: where it can run: a single-process learner on a GPU, liger-kernel installed, a "
        "Llama/Qwen2/Qwen3/Mistral model); off by "
        "default: no faster with packing and chunked log-probs on the models measured (docs/performance.md)")
    compile: bool | None = Field(
        None, description="compile each decoder layer with torch.compile (dynamic shapes; fuses the "
        "elementwise work around the matmuls, forward and backward); checked at start, eager if it fails; "
        "null: on for a single-process learner on a GPU, else off")
    gradient_checkpointing: bool = Field(False, description="recompute decoder-layer activations in backward "
                                         "(non-reentrant): less memory, ~1/3 more compute; pair with "
                                         "a larger micro_batch_tokens")
    staging_max_tokens: int = Field(
        32_000_000, ge=0, description="controller.data_plane=flight: response tokens the learner's staging "
        "store holds (the replicas push each group's payload there once generated, rlfleet/dataplane/"
        "staging.py; ~8-9 bytes a token, each group as int32 ids and float32 log-probs); beyond it a push "
        "is refused and the group is fetched from its replica at Train time; 0: no staging")

    def micro_batch_tokens_on(self, on_gpu: bool) -> int:
        """micro_batch_tokens as it runs, the null resolved. On the CPU a micro-batch of 4096 tokens
        held ~200 MB of float32 activations for the built-in tiny model, 1024 a quarter of that, and
        the step took no longer (bench/RESULTS.md, "Memory of the small CPU job"); on a GPU larger
        micro-batches keep the device busy."""
        if self.micro_batch_tokens is not None:
            return self.micro_batch_tokens
        return 4096 if on_gpu else 1024

    def forward_layout(self, on_gpu: bool) -> tuple[int, bool]:
        """(logprob_chunk_tokens, pack_sequences) as they run, the nulls resolved: on for a single-process
        learner on a GPU, where they won on real batches (docs/performance.md), else off."""
        auto = on_gpu and self.world_size == 1
        chunk = self.logprob_chunk_tokens if self.logprob_chunk_tokens is not None else (8192 if auto else 0)
        pack = self.pack_sequences if self.pack_sequences is not None else auto
        return chunk, pack

    def master_weights_on(self, dtype_bytes: int) -> bool:
        """`master_weights` as it runs for weights of `dtype_bytes` bytes, the null resolved: on for 16-bit
        weights. The sharded learner (world_size > 1) steps its shards in their own dtype for now."""
        return dtype_bytes < 4 and self.master_weights is not False and self.world_size == 1

    def compile_on(self, on_gpu: bool) -> bool:
        """`compile` as it runs, the null resolved (on for a single-process learner on a GPU)."""
        return self.compile if self.compile is not None else (on_gpu and self.world_size == 1)

    @model_validator(mode="after")
    def _sharded_options(self) -> LearnerConfig:
        # The sharded learner (services/learner/fsdp.py) runs the plain forward: chunking reads the
        # lm_head weight outside the FSDP-wrapped forward, where it is still sharded.
        if self.world_size > 1 and ((self.logprob_chunk_tokens or 0) > 0 or self.pack_sequences):
            raise ValueError("learner.logprob_chunk_tokens and learner.pack_sequences are single-process "
                             "options for now; set them to 0/false with learner.world_size > 1")
        if self.world_size > 1 and self.fused_kernels == "liger":  # auto: where it can run, so not there
            raise ValueError("learner.fused_kernels=liger is a single-process option for now; set it to "
                             "none or auto with learner.world_size > 1")
        return self

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        moved = sorted(k for k in ("clip_low", "clip_high", "kl_coef") if isinstance(data, dict)
                       and k in data)
        if moved:
            raise ValueError(f"learner.{moved[0]} moved to algorithm.{moved[0]} (see docs/algorithms.md)")
        return data
