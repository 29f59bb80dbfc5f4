"""Liger's fused kernels on the learner's model (learner.fused_kernels): the same token log-probs and
the same gradients as transformers' own modules, for the architectures `auto` turns them on for."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from services.learner.batching import collate
from services.learner.forward import policy_logprobs
from services.learner.fused_kernels import apply_fused_kernels
from tests.unit.test_static_decode import SHAPE

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("liger_kernel")


@pytest.fixture(autouse=True)
def _transformers_modules_restored(monkeypatch):
    """Liger, even applied to one instance, also replaces transformers' module-level RMSNorm and MLP classes
    and rotary function, so every later Llama/Qwen2 built in this process would carry its kernels: the
    compile test after this file then failed (dynamo cannot trace Liger's RMSNorm function). Restored."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2

    for module, prefix in ((modeling_llama, "Llama"), (modeling_qwen2, "Qwen2")):
        for name in ("apply_rotary_pos_emb", f"{prefix}RMSNorm", f"{prefix}MLP"):
            monkeypatch.setattr(module, name, getattr(module, name))


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device("cuda"):
        if kind == "qwen2":
            return Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=True))
        return LlamaForCausalLM(LlamaConfig(**SHAPE))


def _samples():
    from rlfleet.types import TrainSample

    g = torch.Generator().manual_seed(1)
    out = []
    for p, r in [(5, 9), (12, 3), (7, 14), (3, 6)]:
        ids = torch.randint(2, SHAPE["vocab_size"], (p + r,), generator=g).tolist()
        out.append(TrainSample(prompt_ids=ids[:p], response_ids=ids[p:], behaviour_logprobs=[-1.0] * r,
                               advantage=1.0, generation_version=0, reward=1.0))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_liger_kernels_give_the_same_logprobs_and_gradients(kind):
    results = []
    for setting in ("none", "liger"):
        model = _model(kind)
        assert apply_fused_kernels(model, setting, torch.device("cuda")) == setting
        mb = collate(_samples(), 0, torch.device("cuda"))
        logprobs, _ = policy_logprobs(model, mb, 1.0)
        (logprobs * mb.response_mask_B_T).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((logprobs.detach(), grads))
    (plain_lp, plain_g), (liger_lp, liger_g) = results
    torch.testing.assert_close(liger_lp, plain_lp, atol=2e-4, rtol=0)
    assert (liger_g - plain_g).norm() / plain_g.norm() < 1e-3


def test_a_learner_with_liger_kernels_skips_compile_and_says_why(tiny_model_dir, tmp_path, capsys):
    """Liger's RMSNorm cannot be traced by dynamo, so learner.compile (on by default on a GPU) would fail
    with a bare AssertionError and fall back to eager: with Liger on, compile is not tried, one line says
    why, and the learner trains."""
    from rlfleet.config import LearnerConfig
    from rlfleet.types import TrainBatch
    from services.learner.learner import Learner
    from tests.unit.test_learner_loss_mask import batch

    core = Learner(LearnerConfig(lr=1e-2, fused_kernels="liger"), tiny_model_dir, torch.device("cuda"),
                   torch.bfloat16, tmp_path / "ckpt", max_response_tokens=8)
    metrics = core.train(TrainBatch(step=1, samples=batch(0.0), expected_version=0)).metrics
    said = capsys.readouterr().out
    assert "learner.compile_failed" not in said, said
    assert "learner.compile_skipped" in said and "fused_kernels=liger" in said, said
    assert metrics["learner/tokens"] > 0
