"""Model FLOPs utilisation of a train step, the figure verl reports as `perf/mfu/actor`.

A step's training FLOPs are counted as is usual for MFU: 6 per weight of every matrix multiply per
token (forward 2, backward 4; the lm_head included, even when it shares the embedding's weights),
plus the attention's scores and weighted sums, 12 x layers x heads x head_dim x L^2 for a sample of
L tokens (counted over the whole square, as verl does). Recomputed forwards (old log-probs,
gradient checkpointing) are work the step does beyond the model FLOPs, so they lower the MFU.
"""
from __future__ import annotations

import torch

#: dense bf16 tensor-core peak, FLOP/s, by a substring of torch.cuda.get_device_name (first match
#: wins, so a name that contains another comes before it); a GPU not listed gets no MFU
DENSE_BF16_PEAK = (
    ("B200", 2250e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
)


def dense_bf16_peak_flops(device_name: str) -> float | None:
    return next((peak for key, peak in DENSE_BF16_PEAK if key in device_name), None)


def matmul_weights(model: torch.nn.Module) -> int:
    """Weights that multiply every token: each nn.Linear's matrix (a tied lm_head counts once more)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def train_flops(config, sample_lengths: list[int], weights: int | None = None) -> float:
    """FLOPs of one forward and backward over samples of these lengths (prompt + response tokens).
    `weights`: matmul_weights(model); without it, counted from a decoder config's shapes."""
    if weights is None:
        weights = _decoder_matmul_weights(config)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    attention = 12 * config.num_hidden_layers * heads * head_dim * sum(n * n for n in sample_lengths)
    return 6 * weights * sum(sample_lengths) + attention


def _decoder_matmul_weights(config) -> int:
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * config.num_key_value_heads)  # q, o; k, v
    mlp = 3 * hidden * config.intermediate_size  # gate, up, down
    return config.num_hidden_layers * (attention + mlp) + hidden * config.vocab_size


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    return flops / seconds / peak_flops
