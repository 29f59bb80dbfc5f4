"""Chunked log-probs/entropy through the lm_head equal the full-logits path, values and gradients."""
from __future__ import annotations

import pytest
import torch

from services.learner.chunked_logprobs import chunked_token_logprobs
from services.learner.loss import token_entropy, token_logprobs

pytestmark = pytest.mark.unit


def _inputs(dtype: torch.dtype, N: int = 11, H: int = 6, V: int = 13, bias: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=dtype, requires_grad=True) if bias else None
    targets = torch.randint(0, V, (N,), generator=g)
    return hidden, weight, b, targets


def _reference(hidden, weight, bias, targets, temperature):
    logits = torch.nn.functional.linear(hidden, weight, bias)[None]
    return token_logprobs(logits, targets[None], temperature)[0], token_entropy(logits, temperature)[0]


def _grads(loss: torch.Tensor, *tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 4, 11, 64])  # 4 does not divide N = 11; 64 > N
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_match_full_logits(dtype, temperature, chunk, bias) -> None:
    hidden, weight, b, targets = _inputs(dtype, bias=bias)
    ref_lp, ref_ent = _reference(hidden, weight, b, targets, temperature)
    lp, ent = chunked_token_logprobs(hidden, weight, targets, temperature, chunk, bias_V=b)
    tol = {"atol": 1e-12, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(lp, ref_lp, **tol)
    torch.testing.assert_close(ent, ref_ent, **tol)
    # An arbitrary upstream gradient on both outputs (as a loss with an entropy bonus gives).
    w_lp = torch.linspace(-1, 2, lp.shape[0], dtype=dtype)
    w_ent = torch.linspace(0.5, -0.3, lp.shape[0], dtype=dtype)
    for ours, ref in zip(_grads((lp * w_lp).sum() + (ent * w_ent).sum(), hidden, weight, b),
                         _grads((ref_lp * w_lp).sum() + (ref_ent * w_ent).sum(), hidden, weight, b)):
        torch.testing.assert_close(ours, ref, **tol)
    # Log-probs alone (entropy only a metric): its backward term is skipped and still exact.
    lp, _ = chunked_token_logprobs(hidden, weight, targets, temperature, chunk, bias_V=b)
    ref_lp, _ = _reference(hidden, weight, b, targets, temperature)
    for ours, ref in zip(_grads((lp * w_lp).sum(), hidden, weight, b),
                         _grads((ref_lp * w_lp).sum(), hidden, weight, b)):
        torch.testing.assert_close(ours, ref, **tol)


def test_gradcheck_float64() -> None:
    hidden, weight, b, targets = _inputs(torch.float64, N=5, H=3, V=7, bias=True)

    def fn(h, w, bb):
        lp, ent = chunked_token_logprobs(h, w, targets, 0.8, 2, bias_V=bb)
        return lp, ent

    assert torch.autograd.gradcheck(fn, (hidden, weight, b))


def test_tied_embeddings_gradient_sums_both_uses() -> None:
    """With tied weights the lm_head weight is also the embedding: gradients from both uses add up."""
    torch.manual_seed(0)
    V, H, N = 17, 5, 9
    emb = torch.randn(V, H, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, V, (N,))
    targets = torch.randint(0, V, (N,))

    def run(chunked: bool):
        hidden = torch.tanh(emb[ids] * 1.3)  # a stand-in decoder that reads the embedding
        if chunked:
            lp, ent = chunked_token_logprobs(hidden, emb, targets, 1.3, 4)
        else:
            lp, ent = _reference(hidden, emb, None, targets, 1.3)
        return torch.autograd.grad(lp.sum() - 0.1 * ent.sum(), emb)[0]

    torch.testing.assert_close(run(True), run(False), atol=1e-12, rtol=1e-10)


def test_bf16_close_to_full_logits() -> None:
    hidden, weight, _, targets = _inputs(torch.bfloat16, N=20, H=16, V=50)
    ref_lp, _ = _reference(hidden, weight, None, targets, 1.0)
    lp, _ = chunked_token_logprobs(hidden, weight, targets, 1.0, 6)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)  # same bf16 logits, same fp32 math
    ours = _grads(lp.sum(), hidden, weight)
    ref = _grads(ref_lp.sum(), hidden, weight)
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a.float(), r.float(), atol=3e-2, rtol=3e-2)


def test_no_gradient_through_detached_outputs_and_empty_input() -> None:
    hidden, weight, _, targets = _inputs(torch.float32, N=0)
    lp, ent = chunked_token_logprobs(hidden, weight, targets, 1.0, 4)
    assert lp.shape == ent.shape == (0,)
    lp.sum().backward()
    assert hidden.grad.shape == hidden.shape and weight.grad.abs().sum() == 0


@pytest.mark.parametrize("kwargs, match", [({"temperature": 0.0}, "temperature"),
                                           ({"chunk_tokens": 0}, "chunk_tokens")])
def test_bad_arguments(kwargs, match) -> None:
    hidden, weight, _, targets = _inputs(torch.float32)
    with pytest.raises(ValueError, match=match):
        chunked_token_logprobs(hidden, weight, targets, **kwargs)
