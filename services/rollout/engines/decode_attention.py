"""Decode-step attention over the static KV cache: one Triton kernel that reads each row's cache once.

A decode step has a handful of queries per kv head (the query heads that share it, `groups`) against
a cache of `length` columns, of which only the first `column + 1` have ever been written.
`scaled_dot_product_attention` on an H200 picked cuDNN's flash kernel for this shape: a 64-row
query tile for 3 queries, every one of the `length` columns read at every step, and half of a
SmolLM2-135M generation's GPU time (bench/RESULTS.md). Here one program per (row, kv head) streams
the row's written columns only, in blocks, with an online softmax (the flash-decoding scheme),
all of its query heads at once; columns the row may not see (`valid`: left padding) are masked.

No library in reach does this for our cache layout on this GPU (FlashInfer and FlashAttention are
not in the GPU image and their wheels cannot travel there), so the kernel is ours, kept to this one
shape; elsewhere (CPU, no Triton) the step uses scaled_dot_product_attention.
The bound `column` is read on the device, so the kernel can be captured in a CUDA graph.
"""
from __future__ import annotations

import structlog
import torch
import torch.nn.functional as F

log = structlog.get_logger(__name__)

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs may have no Triton: the SDPA path serves them
    triton = None


def sdpa_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor,
                          column: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, KV, G, D], keys/values [B, KV, L, D], valid [B, L] -> [B, KV, G, D] (every column read)."""
    mask = torch.zeros(valid.shape, dtype=q.dtype, device=q.device).masked_fill_(~valid, float("-inf"))
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None, None, :], scale=scale)


if triton is not None:
    @triton.jit
    def _decode_attention_kernel(Q, K, V, VALID, COLUMN, OUT, scale,
                                 s_qb, s_qh, s_qg, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl, s_mb, s_ob, s_oh, s_og,
                                 KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                                 BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, EXACT: tl.constexpr):
        pid = tl.program_id(0)
        b, h = pid // KV, pid % KV
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        q = tl.load(Q + b * s_qb + h * s_qh + g[:, None] * s_qg + d[None, :], mask=g[:, None] < G, other=0.0)
        end = tl.load(COLUMN) + 1  # columns past the one written this step were never written
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        for start in range(0, end, BLOCK_L):
            cols = start + tl.arange(0, BLOCK_L)
            inside = cols < end
            seen = tl.load(VALID + b * s_mb + cols, mask=inside, other=0) != 0
            k = tl.load(K + b * s_kb + h * s_kh + cols[:, None] * s_kl + d[None, :], mask=inside[:, None],
                        other=0.0)
            if EXACT:  # float32 caches: full-precision dots, not the tensor cores' tf32
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            s = tl.where(seen[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with nothing visible yet
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            v = tl.load(V + b * s_vb + h * s_vh + cols[:, None] * s_vl + d[None, :], mask=inside[:, None],
                        other=0.0)
            if EXACT:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(OUT + b * s_ob + h * s_oh + g[:, None] * s_og + d[None, :], out.to(OUT.dtype.element_ty),
                 mask=g[:, None] < G)


def triton_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor,
                            column: torch.Tensor, scale: float, block_l: int = 64) -> torch.Tensor:
    """As sdpa_decode_attention, reading only columns 0..column of each row (the current one included;
    every row must have at least one visible column there, as a decode step's own always is)."""
    B, KV, G, D = q.shape
    if keys.stride(-1) != 1 or values.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("decode attention needs the head dimension contiguous")
    if D & (D - 1) or D < 16:
        raise ValueError(f"decode attention needs a power-of-two head_dim >= 16, got {D}")
    out = torch.empty((B, KV, G, D), dtype=q.dtype, device=q.device)
    valid_bytes = valid.view(torch.uint8)
    _decode_attention_kernel[(B * KV,)](
        q, keys, values, valid_bytes, column, out, scale,
        q.stride(0), q.stride(1), q.stride(2), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), valid_bytes.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        KV=KV, G=G, D=D, BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_L=block_l,
        EXACT=q.dtype == torch.float32)
    return out


def kernel_works(device: torch.device, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Runs the kernel once on a small random case against SDPA; None if it agrees, else why not (a
    machine whose Triton cannot build it, say): `auto` then decodes with SDPA instead of failing."""
    try:
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(3, 2, 3, head_dim, device=device, dtype=dtype, generator=g)
        keys, values = torch.randn(2, 3, 2, 80, head_dim, device=device, dtype=dtype, generator=g).unbind(0)
        valid = torch.ones(3, 80, dtype=torch.bool, device=device)
        valid[1, :30] = False
        column = torch.tensor([70], device=device)
        got = triton_decode_attention(q, keys, values, valid, column, 0.125).float()
        seen = slice(0, 71)
        ref = sdpa_decode_attention(q.float(), keys[:, :, seen].float(), values[:, :, seen].float(),
                                    valid[:, seen], column, 0.125)
        err = ((got - ref).norm() / ref.norm()).item()
    except Exception as exc:  # noqa: BLE001 - any build or launch failure: SDPA serves
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None if err < 2e-2 else f"disagrees with SDPA (relative error {err:.3g})"


def decode_attention_for(device: torch.device, head_dim: int, kind: str = "auto"):
    """The decode step's attention: `triton` (the kernel above), `sdpa`, or `auto`: the kernel on a CUDA
    device where Triton is installed, the head size suits it and a first run agrees with SDPA, else
    SDPA."""
    power_of_two = head_dim >= 16 and not head_dim & (head_dim - 1)
    usable = triton is not None and device.type == "cuda" and power_of_two
    if kind == "triton" and not usable:
        raise ValueError(f"the Triton decode attention needs a CUDA device, Triton and a power-of-two "
                         f"head_dim >= 16 (device {device}, head_dim {head_dim}, "
                         f"triton {'yes' if triton else 'no'})")
    if kind == "auto" and usable:
        reason = kernel_works(device, head_dim)
        if reason is not None:
            log.warning("rollout.decode_attention_unavailable", reason=reason, using="sdpa")
            usable = False
    use_triton = kind == "triton" or (kind == "auto" and usable)
    return triton_decode_attention if use_triton else sdpa_decode_attention
