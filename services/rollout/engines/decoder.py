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

import torch
import torch.nn.functional as F

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


class StaticDecoder:
    """Runs `model` (one of SUPPORTED_MODEL_TYPES) over a KVCache.

    Rows are left-padded; `valid` [B, length] marks the cache columns a row may attend to
    (its prompt tokens, then each generated token as it is written).
    """

    def __init__(self, model: torch.nn.Module):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the static decode loop cannot run this model: {reason}")
        self.model = model
        self.layers = list(model.model.layers)
        self.groups = model.config.num_attention_heads // model.config.num_key_value_heads

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

    def step(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
             valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token per row: ids [B] at rotary positions [B], attending to the cache columns
        `valid` [B, L] marks and to itself. Returns the logits [B, V] and the token's keys and values
        [layers, B, KV, D]; the caller writes them into the cache (`write`).

        Reads the cache only: a compiled step (torch.compile) then never copies it, as it would
        to functionalise an in-place write. No host synchronisation: safe to capture in a CUDA graph."""
        batch = ids.shape[0]
        mask = valid[:, None, None, :]  # [B, 1, 1, L]: broadcast over kv heads and their query heads
        h = self.model.model.embed_tokens(ids[:, None])
        cos, sin = self.model.model.rotary_emb(h, positions[:, None])
        new_keys, new_values = [], []
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = _project_qkv(attn, layer.input_layernorm(h), cos, sin)
            # One query per head: the heads sharing a kv head become that kv head's queries,
            # so no key/value is repeated: q [B, KV, groups, D] against [B, KV, L, D].
            q = q.reshape(batch, -1, self.groups, attn.head_dim)
            out = _attend_cache_and_self(q, cache.keys[i], cache.values[i], k, v, mask, attn.scaling)
            new_keys.append(k[:, :, 0])
            new_values.append(v[:, :, 0])
            h = h + attn.o_proj(out.reshape(batch, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self._logits(h[:, 0]), torch.stack(new_keys), torch.stack(new_values)

    @staticmethod
    def write(cache: KVCache, column: torch.Tensor, valid: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor) -> None:
        """Stores a step's keys/values [layers, B, KV, D] in cache column `column` (a 1-element long
        tensor, read on each graph replay) and marks it valid: three kernels for all layers."""
        cache.keys.index_copy_(3, column, keys.unsqueeze(3))
        cache.values.index_copy_(3, column, values.unsqueeze(3))
        valid.index_fill_(1, column, True)


def _attend_cache_and_self(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of q [B, KV, G, D] over the cached columns keys/values [B, KV, L, D] that `mask`
    [B, 1, 1, L] allows, plus the token's own key/value [B, KV, 1, D]; softmax in float32.
    Returns [B, KV, G, D]."""
    cached = torch.matmul(q, keys.transpose(-1, -2)).float() * scale  # [B, KV, G, L]
    cached = cached.masked_fill(~mask, float("-inf"))
    own = (q.float() * key.float()).sum(-1, keepdim=True) * scale  # [B, KV, G, 1]
    weights = torch.softmax(torch.cat([cached, own], dim=-1), dim=-1).to(q.dtype)
    return torch.matmul(weights[..., :-1], values) + weights[..., -1:] * value
