"""Per-token log-probs and entropies through the lm_head, a chunk of tokens at a time.

The plain path materialises ``N x V`` logits (and a float32 copy) for every token of a
micro-batch, and autograd keeps them for the backward: for a 152k vocabulary and 16k tokens
that is ~5 GB in bf16 plus the float32 work space, all of it memory traffic. Here the
forward keeps only the final hidden states, the lm_head weight and one float per token
(the log-normaliser and the entropy); the backward recomputes each chunk's logits and turns
them straight into gradients of the hidden states and the lm_head weight. Peak extra memory
is a few ``chunk x V`` float32 buffers, whatever the micro-batch size.

Numerics follow ``services/learner/loss.py``: logits are computed in the model's dtype (as
the lm_head would), then upcast to at least float32 and divided by the temperature.
"""
from __future__ import annotations

import torch

__all__ = ["chunked_token_logprobs"]


def _scaled_logits(hidden_C_H: torch.Tensor, weight_V_H: torch.Tensor, bias_V: torch.Tensor | None,
                   temperature: float, out_dtype: torch.dtype) -> torch.Tensor:
    logits_C_V = torch.nn.functional.linear(hidden_C_H, weight_V_H, bias_V)
    # No -inf clamp as in loss.token_entropy: an lm_head of finite weights gives finite logits,
    # and every pass over a chunk x V buffer costs as much as the matmul's output write.
    scaled_C_V = logits_C_V.to(out_dtype) if logits_C_V.dtype != out_dtype else logits_C_V
    return scaled_C_V.div_(temperature) if temperature != 1.0 else scaled_C_V


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_N_H, weight_V_H, bias_V, targets_N, temperature, chunk):
        out_dtype = torch.promote_types(hidden_N_H.dtype, torch.float32)
        N = hidden_N_H.shape[0]
        logprobs_N = hidden_N_H.new_empty(N, dtype=out_dtype)
        entropy_N = hidden_N_H.new_empty(N, dtype=out_dtype)
        lse_N = hidden_N_H.new_empty(N, dtype=out_dtype)
        for s in range(0, N, chunk):
            z_C_V = _scaled_logits(hidden_N_H[s:s + chunk], weight_V_H, bias_V, temperature, out_dtype)
            lse_C = torch.logsumexp(z_C_V, dim=-1)
            lse_N[s:s + chunk] = lse_C
            logprobs_N[s:s + chunk] = z_C_V.gather(-1, targets_N[s:s + chunk, None]).squeeze(-1) - lse_C
            # H = lse - sum_v p_v z_v; z is reused in place as p * z to keep one C x V buffer.
            p_C_V = (z_C_V - lse_C[:, None]).exp_()
            entropy_N[s:s + chunk] = lse_C - z_C_V.mul_(p_C_V).sum(-1)
        ctx.save_for_backward(hidden_N_H, weight_V_H, bias_V, targets_N, lse_N, entropy_N)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)  # an unused output (entropy without grad) costs nothing
        return logprobs_N, entropy_N

    @staticmethod
    def backward(ctx, grad_logprobs_N, grad_entropy_N):
        hidden_N_H, weight_V_H, bias_V, targets_N, lse_N, entropy_N = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden_N_H) if need_h else None
        # Accumulated in float32 across chunks, cast once: a bf16 running sum would round at every chunk.
        acc_dtype = torch.promote_types(weight_V_H.dtype, torch.float32)
        grad_w = torch.zeros_like(weight_V_H, dtype=acc_dtype) if need_w else None
        grad_b = torch.zeros_like(bias_V, dtype=acc_dtype) if need_b else None
        if grad_logprobs_N is None and grad_entropy_N is None:
            return None, None, None, None, None, None
        out_dtype = lse_N.dtype
        # z = logits / T, so d/dlogits = d/dz / T: folded into the per-token upstream gradients
        # (N floats) instead of one more pass over each chunk.
        if grad_logprobs_N is not None:
            grad_logprobs_N = grad_logprobs_N / ctx.temperature
        if grad_entropy_N is not None:
            grad_entropy_N = grad_entropy_N / ctx.temperature
        for s in range(0, hidden_N_H.shape[0], ctx.chunk):
            e = s + ctx.chunk
            h_C_H = hidden_N_H[s:e]
            logp_C_V = _scaled_logits(h_C_H, weight_V_H, bias_V, ctx.temperature, out_dtype)
            logp_C_V.sub_(lse_N[s:e, None])
            p_C_V = logp_C_V.exp()
            # d(z) of: logprob = z_t - lse  ->  onehot - p ;  entropy  ->  -p * (log p + H)
            if grad_entropy_N is not None:
                g_C_V = logp_C_V.add_(entropy_N[s:e, None]).mul_(p_C_V).mul_(-grad_entropy_N[s:e, None])
                if grad_logprobs_N is not None:
                    g_C_V.sub_(p_C_V.mul_(grad_logprobs_N[s:e, None]))
            else:
                g_C_V = p_C_V.mul_(-grad_logprobs_N[s:e, None])
            if grad_logprobs_N is not None:
                g_C_V.scatter_add_(-1, targets_N[s:e, None], grad_logprobs_N[s:e, None].to(out_dtype))
            g_C_V = g_C_V.to(hidden_N_H.dtype)
            if need_h:
                grad_h[s:e] = g_C_V @ weight_V_H
            if need_w:
                grad_w += (g_C_V.t() @ h_C_H).to(acc_dtype)
            if need_b:
                grad_b += g_C_V.sum(0).to(acc_dtype)
        return (grad_h, grad_w.to(weight_V_H.dtype) if need_w else None,
                grad_b.to(bias_V.dtype) if need_b else None, None, None, None)


def chunked_token_logprobs(hidden_N_H: torch.Tensor, weight_V_H: torch.Tensor, targets_N: torch.Tensor,
                           temperature: float = 1.0, chunk_tokens: int = 4096,
                           bias_V: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs_N, entropy_N)`` of ``softmax((hidden @ weight.T + bias) / temperature)``.

    Equal to ``token_logprobs`` / ``token_entropy`` of the full logits (same dtype rules),
    with gradients w.r.t. ``hidden_N_H``, ``weight_V_H`` and ``bias_V``, but never more than
    ``chunk_tokens`` rows of logits alive at once. Detach the entropy (or leave it out of the
    loss) when it is only a metric: its backward term is then skipped.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if hidden_N_H.dim() != 2 or targets_N.shape != hidden_N_H.shape[:1]:
        raise ValueError(f"expected hidden [N, H] and targets [N], got {tuple(hidden_N_H.shape)} "
                         f"and {tuple(targets_N.shape)}")
    return _ChunkedLogprobs.apply(hidden_N_H, weight_V_H, bias_V, targets_N.long(), float(temperature),
                                  int(chunk_tokens))
