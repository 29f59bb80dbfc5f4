"""The learner's forward passes run without cuDNN attention (a plan built per new shape stalled the GPU)."""
import pytest
import torch

from services.learner.forward import shape_stable_attention
from services.learner.update import PolicyUpdate

pytestmark = pytest.mark.unit


def test_context_turns_cudnn_attention_off_and_back():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with shape_stable_attention():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_a_train_batch_runs_inside_it(monkeypatch):
    seen = []
    monkeypatch.setattr(PolicyUpdate, "_run", lambda self, batch: seen.append(
        torch.backends.cuda.cudnn_sdp_enabled()) or {})
    PolicyUpdate.run(object.__new__(PolicyUpdate), batch=None)
    assert seen == [False]
