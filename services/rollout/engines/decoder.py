"""A Llama-family decoder run over a static KV cache: one prefill, then one token per step.

transformers' `generate()` grows its cache by concatenation and launches every kernel from
Python each step; at batch 256 on an H200 that left decode launch-bound. Here the cache is
preallocated and every decode step has the same shapes and addresses, so the step can be
captured once as a CUDA graph (`graphs.py`). The model's own modules (projections, norms,
MLP, rotary embedding, lm_head) do the maths, so weights copied into the model in place
are what the next step uses; only the attention's cache handling is ours.
"""
from __future__ import annotations

from dataclasses import dataclass

import structlog
import torch
import torch.nn.functional as F

from services.rollout.engines.decode_attention import decode_attention_for

log = structlog.get_logger(__name__)

#: decoder-only architectures whose layers are pre-norm attention + MLP, as this module runs them
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
#: rotary variants whose frequencies do not depend on the sequence length seen (graph-safe)
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why this decoder cannot run `model`, or None if it can."""
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {config.model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
    rope_type = getattr(model.model.rotary_emb, "rope_type", "default")
    if not isinstance(rope_type, str) or rope_type not in STATIC_ROPE_TYPES:
        return f"rotary embedding type {rope_type!r} changes with sequence length"
    if any(getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers):
        return "sliding-window attention"
    return None


@dataclass
class KVCache:
    """Keys and values of every layer: [layers, batch, kv_heads, length, head_dim] each."""
    keys: torch.Tensor
    values: torch.Tensor

    @classmethod
    def allocate(cls, model: torch.nn.Module, batch: int, length: int) -> KVCache:
        attn = model.model.layers[0].self_attn
        kv_heads = model.config.num_key_value_heads
        shape = (len(model.model.layers), batch, kv_heads, length, attn.head_dim)
        param = next(model.parameters())
        return cls(torch.zeros(shape, dtype=param.dtype, device=param.device),
                   torch.zeros(shape, dtype=param.dtype, device=param.device))

    @property
    def batch(self) -> int:
        return self.keys.shape[1]

    @property
    def length(self) -> int:
        return self.keys.shape[3]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _project_qkv(attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Queries [B, H, T, D] and keys/values [B, KV, T, D], rotary applied (Qwen3's q/k norms too)."""
    batch, steps, _ = x.shape
    q = attn.q_proj(x).view(batch, steps, -1, attn.head_dim)
    k = attn.k_proj(x).view(batch, steps, -1, attn.head_dim)
    v = attn.v_proj(x).view(batch, steps, -1, attn.head_dim)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


@dataclass
class FusedProjections:
    """One layer's q/k/v projections as one matrix and its MLP's gate/up as another, so a decode
    step runs two matmuls where it ran five: at decode batch sizes each projection is a small,
    launch-bound kernel. The model's own q/k/v/gate/up weights become views of these matrices
    (`fuse_projections`), so weights copied into the model in place (every weight sync) are what
    the fused matmuls read: nothing is copied twice and nothing goes stale."""
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    qkv_sizes: tuple[int, int, int]
    gate_up_weight: torch.Tensor


def _fuse(linears: list[torch.nn.Linear], attr: str) -> torch.Tensor | None:
    """Concatenates the linears' `attr` (weight or bias) along the output dimension and makes each
    linear's own parameter a view of its rows; None if none of them has it."""
    parts = [getattr(lin, attr) for lin in linears]
    if all(p is None for p in parts):
        return None
    fused = torch.cat([p.detach() for p in parts])
    start = 0
    for p in parts:
        p.data = fused[start:start + p.shape[0]]
        start += p.shape[0]
    return fused


def fuse_projections(layer: torch.nn.Module) -> FusedProjections:
    attn, mlp = layer.self_attn, layer.mlp
    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    if len({lin.bias is None for lin in qkv}) != 1:
        raise ValueError("q/k/v projections that differ in having a bias cannot be fused")
    return FusedProjections(_fuse(qkv, "weight"), _fuse(qkv, "bias"),
                            tuple(lin.out_features for lin in qkv),
                            _fuse([mlp.gate_proj, mlp.up_proj], "weight"))


def _pre_attention(layer: torch.nn.Module, fused: FusedProjections | None, h: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode step's layer input [B, 1, H] to queries [B, KV, groups, D] (the heads sharing a kv head
    become that kv head's queries, so no key/value is repeated) and keys/values [B, KV, 1, D].
    `fused` None: the model's three projections (the unfused arm of bench/onegpu_profile.py)."""
    attn = layer.self_attn
    batch, D = h.shape[0], attn.head_dim
    if fused is None:
        q, k, v = _project_qkv(attn, layer.input_layernorm(h), cos, sin)
        return q.reshape(batch, -1, groups, D), k, v
    qkv = F.linear(layer.input_layernorm(h), fused.qkv_weight, fused.qkv_bias)
    q, k, v = (t.view(batch, 1, -1, D) for t in qkv.split(fused.qkv_sizes, dim=-1))
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    return q.reshape(batch, -1, groups, D), k, v


def _post_attention(layer: torch.nn.Module, fused: FusedProjections | None, h: torch.Tensor,
                    out: torch.Tensor) -> torch.Tensor:
    """The rest of a layer: output projection, residual, post-attention norm, MLP, residual."""
    mlp = layer.mlp
    h = h + layer.self_attn.o_proj(out.reshape(h.shape[0], 1, -1))
    if fused is None:
        return h + mlp(layer.post_attention_layernorm(h))
    gate, up = F.linear(layer.post_attention_layernorm(h), fused.gate_up_weight).chunk(2, dim=-1)
    return h + mlp.down_proj(mlp.act_fn(gate) * up)


class CompiledRegion:
    """`torch.compile(fn)`, or `fn` itself from the first call on which compiling fails on this
    machine (no Triton, no C compiler, an unsupported op): the decode loop then runs eager, slower
    but right, and says why once."""

    def __init__(self, fn):
        self.fn = fn
        self.compiled = torch.compile(fn, dynamic=True, fullgraph=True)

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001 - any compiler failure: fall back, never fail generation
                if isinstance(exc, torch.OutOfMemoryError):
                    raise
                log.warning("rollout.compile_decode_failed", region=self.fn.__name__, using="eager",
                            error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                self.compiled = None
        return self.fn(*args)


class StaticDecoder:
    """Runs `model` (one of SUPPORTED_MODEL_TYPES) over a KVCache.

    Rows are left-padded; `valid` [B, length] marks the cache columns a row may attend to
    (its prompt tokens, then each generated token as it is written).

    With `compile_layers` (GPU) a decode step's two per-layer regions, before and after the
    attention, are compiled with torch.compile: a small model's step is bound by its kernel count
    (a few dozen small kernels per layer, launched one after another even from a CUDA graph), and
    the compiler fuses each region's norm, rotary embedding, residual adds and activation. One
    compilation serves every layer (they share code and shapes) and every batch and cache size
    (dynamic shapes). The cache writes and the attention stay outside the compiled regions, so
    the compiler never copies the cache to make an in-place write functional.
    """

    def __init__(self, model: torch.nn.Module, compile_layers: bool = False, fuse: bool = True,
                 attention: str = "auto"):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the static decode loop cannot run this model: {reason}")
        self.model = model
        self.layers = list(model.model.layers)
        self.groups = model.config.num_attention_heads // model.config.num_key_value_heads
        self.fused = [fuse_projections(layer) if fuse else None for layer in self.layers]
        # decode_attention.py: our Triton kernel on a GPU (reads each row's written columns once), else SDPA
        self.attention = decode_attention_for(next(model.parameters()).device,
                                              self.layers[0].self_attn.head_dim, attention)
        self.pre_attention, self.post_attention = _pre_attention, _post_attention
        if compile_layers:
            self.pre_attention = CompiledRegion(_pre_attention)
            self.post_attention = CompiledRegion(_post_attention)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model.norm(h)).float()

    def prefill(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
                valid: torch.Tensor) -> torch.Tensor:
        """Runs the prompts ids [B, W] (left-padded) into cache columns 0..W-1; returns the
        float32 logits of each row's last column [B, V]."""
        width = ids.shape[1]
        # Causal and not padding; every column may see itself, so a padding row's softmax
        # never has nothing to attend to (which would make NaNs that reach real rows' caches).
        causal = torch.ones(width, width, dtype=torch.bool, device=ids.device).tril()
        mask = (causal & valid[:, None, :width]) | torch.eye(width, dtype=torch.bool, device=ids.device)
        mask = mask[:, None]
        h = self.model.model.embed_tokens(ids)
        cos, sin = self.model.model.rotary_emb(h, positions)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = _project_qkv(attn, layer.input_layernorm(h), cos, sin)
            cache.keys[i, :, :, :width] = k
            cache.values[i, :, :, :width] = v
            k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(*h.shape[:2], -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self._logits(h[:, -1])

    def step(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, column: torch.Tensor,
             valid: torch.Tensor) -> torch.Tensor:
        """One token per row: ids [B] at rotary positions [B], written to cache column `column`
        (a 1-element long tensor, so a captured graph reads it each replay). Returns logits [B, V].
        No host synchronisation: safe to capture in a CUDA graph."""
        valid.index_fill_(1, column, True)
        h = self.model.model.embed_tokens(ids[:, None])
        cos, sin = self.model.model.rotary_emb(h, positions[:, None])
        for i, (layer, fused) in enumerate(zip(self.layers, self.fused)):
            q, k, v = self.pre_attention(layer, fused, h, cos, sin, self.groups)
            keys, values = cache.keys[i], cache.values[i]
            keys.index_copy_(2, column, k)
            values.index_copy_(2, column, v)
            out = self.attention(q, keys, values, valid, column, layer.self_attn.scaling)
            h = self.post_attention(layer, fused, h, out)
        return self._logits(h[:, 0])
