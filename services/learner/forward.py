"""The policy's per-token log-probs and entropies for a micro-batch, by one of four routes.

``padded`` x ``packed`` (services/learner/packing.py) picks the model input layout;
``full`` x ``chunked`` (services/learner/chunked_logprobs.py) picks how the lm_head output
becomes log-probs. Whatever the route, the result is in the micro-batch's padded ``B x T``
layout and agrees with the plain route (padded + full logits) at every response position.
The chunked route computes only response positions (the only ones any loss or metric reads,
services/learner/loss.py masks the rest) and returns 0 elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from services.learner.batching import MicroBatch
from services.learner.chunked_logprobs import chunked_token_logprobs
from services.learner.loss import token_entropy, token_logprobs


@dataclass(frozen=True)
class ForwardSettings:
    logprob_chunk_tokens: int = 0  # 0: full logits (the plain route)
    pack_sequences: bool = False

    @classmethod
    def of(cls, learner_cfg, device: torch.device) -> ForwardSettings:
        chunk, pack = learner_cfg.forward_layout(on_gpu=device.type == "cuda")
        if pack:
            _require_packed_masks()
        return cls(chunk, pack)


def _require_packed_masks() -> None:
    """Packing relies on transformers deriving block-diagonal masks from restarting position ids;
    a transformers without that would silently let packed samples attend to each other."""
    from transformers import masking_utils

    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        import transformers

        raise ValueError(f"learner.pack_sequences needs a transformers that masks packed sequences by their "
                         f"position ids; transformers {transformers.__version__} does not: upgrade it or set "
                         f"learner.pack_sequences=false")


PLAIN = ForwardSettings()


def shape_stable_attention():
    """A context in which the model's scaled_dot_product_attention never takes cuDNN's kernel.

    cuDNN builds an execution plan for every new input shape, and a learner sees new shapes every
    micro-batch (packed rows, response lengths): on one H200 each build held the GPU idle ~50 ms,
    forward and backward, about 0.2 s of a 0.9 s step of SmolLM2-135M (bench/RESULTS.md). The
    flash and memory-efficient kernels need no per-shape plan. Backward follows the kernel forward
    chose, so wrapping the forward passes is enough."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _base(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "peft_config") else model


def split_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear]:
    """The decoder (final hidden states) and the plain lm_head of a causal LM, or a clear error
    for models whose logits are more than ``lm_head(hidden)``."""
    base = _base(model)
    head = base.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise ValueError(f"learner.logprob_chunk_tokens needs a plain nn.Linear lm_head, the model has "
                         f"{type(head).__name__} (LoRA on lm_head is not supported with chunked log-probs)")
    for attr in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling"):
        if getattr(base.config, attr, None) not in (None, 1, 1.0):
            raise ValueError(f"learner.logprob_chunk_tokens: the model scales its logits ({attr}); "
                             f"use full logits (logprob_chunk_tokens=0)")
    return base.get_decoder(), head


def _model_inputs(mb: MicroBatch, settings: ForwardSettings) -> dict:
    if settings.pack_sequences:
        if mb.packed is None:
            raise ValueError("pack_sequences is on but the micro-batch was collated without a packed layout")
        # attention_mask=None lets masking_utils derive the block-diagonal mask from the position ids.
        return {"input_ids": mb.packed.input_ids_R_C, "position_ids": mb.packed.position_ids_R_C,
                "attention_mask": None, "use_cache": False}
    return {"input_ids": mb.input_ids_B_L, "attention_mask": mb.attention_mask_B_L}


def _to_padded(values_R_T: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    return values_R_T.reshape(-1)[mb.packed.index_B_T]


def _full_logits(model, mb, temperature, settings, entropy_grad: bool, with_entropy: bool):
    logits_X_T_V = model(**_model_inputs(mb, settings)).logits[:, :-1]
    targets_X_T = mb.packed.input_ids_R_C[:, 1:] if settings.pack_sequences else mb.targets_B_T
    logprobs_X_T = token_logprobs(logits_X_T_V, targets_X_T, temperature)
    entropy_X_T = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy_X_T = token_entropy(logits_X_T_V, temperature)
    if settings.pack_sequences:
        return _to_padded(logprobs_X_T, mb), None if entropy_X_T is None else _to_padded(entropy_X_T, mb)
    return logprobs_X_T, entropy_X_T


def _chunked(model, mb, temperature, settings, entropy_grad: bool, with_entropy: bool):
    decoder, head = split_head(model)
    hidden_X_L_H = decoder(**_model_inputs(mb, settings)).last_hidden_state
    hidden_M_H = hidden_X_L_H[:, :-1].reshape(-1, hidden_X_L_H.shape[-1])
    keep_B_T = mb.response_mask_B_T.bool()
    if settings.pack_sequences:
        rows_N = mb.packed.index_B_T[keep_B_T]
        targets_N = mb.packed.input_ids_R_C[:, 1:].reshape(-1)[rows_N]
    else:
        rows_N = keep_B_T.reshape(-1).nonzero().squeeze(-1)
        targets_N = mb.targets_B_T[keep_B_T]
    logprobs_N, entropy_N = chunked_token_logprobs(hidden_M_H[rows_N], head.weight, targets_N, temperature,
                                                   settings.logprob_chunk_tokens, head.bias)
    if not entropy_grad:
        entropy_N = entropy_N.detach()
    logprobs_B_T = logprobs_N.new_zeros(keep_B_T.shape).masked_scatter(keep_B_T, logprobs_N)
    if not with_entropy:  # computed anyway (one extra pass over each chunk), just not returned
        return logprobs_B_T, None
    entropy_B_T = entropy_N.new_zeros(keep_B_T.shape).masked_scatter(keep_B_T, entropy_N)
    return logprobs_B_T, entropy_B_T


def policy_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float,
                    settings: ForwardSettings = PLAIN, entropy_grad: bool = False, with_entropy: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs_B_T, entropy_B_T)``; the entropy carries a gradient only with ``entropy_grad``
    and is None without ``with_entropy``."""
    route = _chunked if settings.logprob_chunk_tokens > 0 else _full_logits
    return route(model, mb, temperature, settings, entropy_grad, with_entropy)
