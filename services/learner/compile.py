"""`learner.compile`: each decoder layer of the policy compiled by torch.compile (dynamic shapes).

A small model's train step is mostly elementwise work around its matmuls: RMSNorm's float32
round trip, the rotary embedding on strided heads, SiLU x up, residual adds. On one H200 those
kernels took ~300 ms of a SmolLM2-135M step whose matmuls took ~110 ms (bench/RESULTS.md). The
compiler fuses each layer's elementwise chains, forward and backward, into a few kernels. One
compilation serves every layer (they share code) and every micro-batch shape (dynamic shapes).

Compiling is checked once, at start, by a forward and backward of a tiny packed batch; a machine
where it fails (no Triton, no compiler, an unsupported op) trains eager and says why, once.
"""
from __future__ import annotations

import structlog
import torch

log = structlog.get_logger(__name__)


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    decoder = base.get_decoder()
    return list(getattr(decoder, "layers", []))


def _uncompile(layers: list[torch.nn.Module]) -> None:
    for layer in layers:
        layer._compiled_call_impl = None  # what nn.Module.compile set: calls go to forward again


def _warm_up(model: torch.nn.Module, device: torch.device) -> None:
    """A forward and backward of two packed samples (the layout a GPU learner trains on), gradients
    dropped: compiles forward and backward now instead of inside the first step."""
    from services.learner.forward import shape_stable_attention

    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (1, 48), device=device)
    positions = torch.cat([torch.arange(20), torch.arange(28)]).to(device)[None]
    with shape_stable_attention():  # the attention kernel the train steps run is the one traced
        out = model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False)
        out.logits.float().mean().backward()
    model.zero_grad(set_to_none=True)


def compile_layers(model: torch.nn.Module, device: torch.device, backend: str = "inductor") -> bool:
    """Compiles every decoder layer of `model` in place; True if that worked, False (layers eager
    again, a warning logged) if compiling or the warm-up failed."""
    layers = _layers(model)
    if not layers:
        log.warning("learner.compile_unavailable", reason="the model has no decoder layers to compile")
        return False
    try:
        for layer in layers:
            layer.compile(dynamic=True, backend=backend)
        _warm_up(model, device)
    except Exception as exc:  # noqa: BLE001 - any compiler failure: train eager, never fail the learner
        if isinstance(exc, torch.OutOfMemoryError):
            raise
        _uncompile(layers)
        torch._dynamo.reset()
        model.zero_grad(set_to_none=True)
        first = str(exc).splitlines()[0] if str(exc) else ""
        log.warning("learner.compile_failed", using="eager", error=f"{type(exc).__name__}: {first[:300]}")
        return False
    log.info("learner.compiled", layers=len(layers))
    return True
