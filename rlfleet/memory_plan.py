"""Two roles on one GPU, planned: how much memory the rollout and the learner need, and whether
their shares of the GPU (rollout.gpu_memory_utilization, learner.gpu_memory_utilization) hold it.

Why estimate before loading: a rollout that fills the GPU with KV cache leaves the learner to die
of an out-of-memory error at its first large batch, minutes into the run, with a message that
names neither setting. Each role's share caps its allocator (set_per_process_memory_fraction), and
the estimate below says up front, naming the keys and the sizes, when a share cannot hold the
role's settings. Estimates are deliberately on the high side (worst-case buckets, fp32 logits).

Pure: the model's config.json as a dict, the job config and the GPU's size in; no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from rlfleet.errors import ConfigError

GIB = 1 << 30
#: what a process's CUDA context, cuBLAS workspaces and allocator slack take outside its tensors
CONTEXT_BYTES = GIB // 2
#: shares of a GPU that the rollout and the learner take by default when they share one
SHARED_ROLLOUT_SHARE, SHARED_LEARNER_SHARE = 0.30, 0.60
ALONE_ROLLOUT_SHARE = 0.85  # vLLM's customary default on a GPU of its own
MAX_SHARES = 0.95  # what both may take together: the rest is contexts and fragmentation
# the rollout's static decode loop (services/rollout/engines): batch and length buckets, slots kept
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_LENGTH_ALIGN, _SLOTS_KEPT, _PREFILL_TOKENS = 64, 2, 16384


@dataclass(frozen=True)
class Shape:
    """What the estimates need of a decoder-only model's config.json."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    context: int

    @classmethod
    def from_config(cls, config: dict) -> Shape:
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            return cls(layers=int(config["num_hidden_layers"]), hidden=hidden,
                       intermediate=int(config["intermediate_size"]), heads=heads,
                       kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_dim=int(config.get("head_dim") or hidden // heads),
                       vocab=int(config["vocab_size"]),
                       tied=bool(config.get("tie_word_embeddings", False)),
                       context=int(config.get("max_position_embeddings") or 4096))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"the model's config.json lacks what the memory plan needs ({exc})") from None

    @property
    def params(self) -> int:
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * layer + self.hidden + head


def _bucket(rows: int) -> int:
    return next((b for b in _BATCH_BUCKETS if b >= rows), rows)


def rollout_bytes(shape: Shape, dtype_bytes: int, max_batch_sequences: int,
                  max_tokens: int) -> dict[str, int]:
    """The transformers rollout on a GPU: weights, a staging copy for weight updates, KV caches of the
    decode slots it keeps, prefill activations and the logits of a decode step."""
    batch, length = _bucket(max_batch_sequences), -(-max_tokens // _LENGTH_ALIGN) * _LENGTH_ALIGN
    kv = 2 * shape.layers * batch * shape.kv_heads * length * shape.head_dim * dtype_bytes * _SLOTS_KEPT
    prefill = _PREFILL_TOKENS * (4 * shape.hidden + 2 * shape.intermediate) * dtype_bytes
    # fp32 logits: a decode step's output, the sampler's temporaries (x2), and the outputs of the slots
    # that finished-row compaction narrows to (half, a quarter, ... of the batch: under one more)
    logits = 4 * batch * shape.vocab * 4
    return {"weights": shape.params * dtype_bytes, "weight staging": shape.params * dtype_bytes,
            "KV cache": kv, "activations": prefill + logits, "CUDA context": CONTEXT_BYTES}


def learner_bytes(shape: Shape, dtype_bytes: int, micro_batch_tokens: int, checkpointing: bool,
                  logprob_chunk_tokens: int, master_weights: bool = False) -> dict[str, int]:
    """The learner: weights, gradients, AdamW's two moments (in the weights' dtype; float32 with
    `master_weights`, which adds the float32 copies and their gradients: services/learner/
    master_weights.py), the buffer a weight push packs into, the activations of one micro-batch and
    its fp32 logits."""
    p, t = shape.params, micro_batch_tokens
    per_layer = t * (16 * shape.hidden + 6 * shape.intermediate) * dtype_bytes
    acts = (shape.layers * t * shape.hidden * dtype_bytes + per_layer if checkpointing
            else shape.layers * per_layer)
    logit_tokens = min(t, logprob_chunk_tokens) if logprob_chunk_tokens else t
    need = {"weights": p * dtype_bytes, "gradients": p * dtype_bytes,
            "optimizer": 2 * p * (4 if master_weights else dtype_bytes),
            "weight push buffer": p * dtype_bytes, "activations": acts,
            "logits": 3 * logit_tokens * shape.vocab * 4, "CUDA context": CONTEXT_BYTES}
    if master_weights:
        need["master weights"] = 2 * p * 4  # the float32 copies and, during a step, their gradients
    return need


#: the micro-batch the plan picks when learner.micro_batch_tokens is unset: the largest multiple of
#: AUTO_MICRO_BATCH_STEP tokens that fits the learner's share, at most AUTO_MICRO_BATCH_MAX (the size the
#: SmolLM2 recipes were measured with; a larger one adds no measured speed and only memory)
AUTO_MICRO_BATCH_STEP, AUTO_MICRO_BATCH_MAX = 1024, 32768


def largest_micro_batch(shape: Shape, dtype_bytes: int, budget_bytes: float, checkpointing: bool,
                        logprob_chunk_tokens: int, master_weights: bool = False) -> int | None:
    """The largest micro_batch_tokens (a multiple of AUTO_MICRO_BATCH_STEP, at most AUTO_MICRO_BATCH_MAX)
    whose learner_bytes fit `budget_bytes`; None when not even one step's worth fits."""
    best = None
    for tokens in range(AUTO_MICRO_BATCH_STEP, AUTO_MICRO_BATCH_MAX + 1, AUTO_MICRO_BATCH_STEP):
        need = learner_bytes(shape, dtype_bytes, tokens, checkpointing, logprob_chunk_tokens, master_weights)
        if sum(need.values()) > budget_bytes:
            break  # the estimate grows with the tokens: no larger size fits either
        best = tokens
    return best


#: a derived rollout share holds its estimate and this much more: the estimate is the plan's, not a
#: measurement, and an allocator capped at exactly it has no room for what the plan leaves out (the
#: one-GPU job ran on an 80 GB H100 at 0.36 for a 26.9 GiB estimate, 2026-12-05)
ROLLOUT_HEADROOM = 1.05


class Shares(NamedTuple):
    """The two shares in force and why they are what they are (the plans log it)."""
    rollout: float
    learner: float
    why: str


def whole_percent_up(need_bytes: int, gpu_bytes: int) -> float:
    """The smallest whole percent of the GPU that holds `need_bytes` (integers: no float rounding)."""
    return -(-need_bytes * 100 // gpu_bytes) / 100


def resolve_shares(rollout_share: float | None, learner_share: float | None, shared: bool,
                   rollout_need_bytes: int | None = None, gpu_bytes: int = 0) -> Shares:
    """The two shares in force: a configured one as it is; an unset one from the defaults and the plan.

    On a GPU of its own each role takes ALONE_ROLLOUT_SHARE / all of it. On a shared GPU the defaults
    (SHARED_ROLLOUT_SHARE, SHARED_LEARNER_SHARE) were measured on a 139 GiB H200 while the rollout's
    need is absolute, so an unset share is derived rather than fixed:
    - the rollout's: its estimate (`rollout_need_bytes`, None where its engine sizes itself) and
      ROLLOUT_HEADROOM, in whole percents rounded up, never below SHARED_ROLLOUT_SHARE; with the
      learner's share set, at most what that leaves of MAX_SHARES (the rollout's check then says when
      that is too little);
    - the learner's: what the rollout's leaves of MAX_SHARES, never above SHARED_LEARNER_SHARE (its own
      check and auto micro-batch decide what it does with it).
    Both shares set: kept, and refused when together over MAX_SHARES. Each process computes this from
    the whole job, so the rollout's and the learner's processes reach the same answer."""
    if not shared:
        return Shares(ALONE_ROLLOUT_SHARE if rollout_share is None else rollout_share,
                      1.0 if learner_share is None else learner_share, "a GPU of its own")
    reasons = []
    if rollout_share is None:
        wanted = SHARED_ROLLOUT_SHARE
        if rollout_need_bytes is not None:
            wanted = max(wanted, whole_percent_up(int(rollout_need_bytes * ROLLOUT_HEADROOM), gpu_bytes))
        rollout_share = wanted
        if learner_share is not None:
            rollout_share = min(wanted, round(MAX_SHARES - learner_share, 2))
            _refuse_nothing_left(rollout_share, "learner", learner_share, "rollout")
        reasons.append(f"rollout: what learner.gpu_memory_utilization={learner_share:g} leaves"
                       if rollout_share < wanted else _rollout_reason(rollout_need_bytes, gpu_bytes))
    if learner_share is None:
        learner_share = min(SHARED_LEARNER_SHARE, round(MAX_SHARES - rollout_share, 2))
        _refuse_nothing_left(learner_share, "rollout", rollout_share, "learner")
        reasons.append(f"learner: at most {SHARED_LEARNER_SHARE:g}, within {MAX_SHARES:g} together")
    together = rollout_share + learner_share
    if together > MAX_SHARES + 1e-9:  # a derived 0.59 beside 0.36 may add up to 0.9500000000000001
        raise ConfigError(f"rollout.gpu_memory_utilization ({rollout_share:g}) + learner.gpu_memory_"
                          f"utilization ({learner_share:g}) = {together:g} on one shared GPU; together they "
                          f"may take at most {MAX_SHARES:g} (the rest is the two processes' CUDA contexts)")
    return Shares(rollout_share, learner_share, "; ".join(reasons) or "both set")


def _refuse_nothing_left(derived: float, set_role: str, set_share: float, other_role: str) -> None:
    if derived <= 0:
        raise ConfigError(f"{set_role}.gpu_memory_utilization ({set_share:g}) leaves the {other_role} "
                          f"nothing of the {MAX_SHARES:g} the two roles may take together on one shared GPU; "
                          f"lower it, or give each role a GPU of its own")


def _rollout_reason(need_bytes: int | None, gpu_bytes: int) -> str:
    if need_bytes is None:
        return f"rollout: the default {SHARED_ROLLOUT_SHARE:g} (its engine sizes itself)"
    return (f"rollout: its estimate {need_bytes / GIB:.1f} GiB of this {gpu_bytes / GIB:.0f} GiB GPU and "
            f"{ROLLOUT_HEADROOM - 1:.0%} more, at least {SHARED_ROLLOUT_SHARE:g}")


def check(role: str, need: dict[str, int], share: float, gpu_bytes: int, key: str, hints: str,
          why: str = "", can_raise: bool = True) -> None:
    """ConfigError naming the role's share key, the sizes and what to change, when `need` exceeds it.
    `why`: how the share was chosen when the user did not set it; `can_raise`: False where no larger
    share is possible (the rollout's need beyond MAX_SHARES of a shared GPU)."""
    budget = share * gpu_bytes
    total = sum(need.values())
    if total <= budget:
        return
    parts = ", ".join(f"{name} {size / GIB:.1f}" for name, size in need.items() if size >= GIB // 20)
    derived = f" ({why})" if why else ""
    remedy = f"raise {key} or lower {hints}" if can_raise else f"lower {hints}"
    raise ConfigError(f"{role} needs about {total / GIB:.1f} GiB of GPU memory ({parts} GiB) but {key}="
                      f"{share:g}{derived} of this {gpu_bytes / GIB:.0f} GiB GPU gives it {budget / GIB:.1f} "
                      f"GiB; {remedy}")
