"""learner.compile on a GPU with inductor: the compiled layers train to the eager gradients, packed layout."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from services.learner.compile import compile_layers
from services.learner.forward import shape_stable_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).cuda().train()


def test_compiled_layers_match_eager_on_packed_rows_of_changing_shapes():
    eager, compiled = _model(), _model()
    assert compile_layers(compiled, torch.device("cuda")) is True
    for lengths in ((30, 50), (17, 40, 61)):  # two packed layouts: dynamic shapes, no failure
        ids = torch.randint(0, 512, (1, sum(lengths)), device="cuda")
        positions = torch.cat([torch.arange(n) for n in lengths]).cuda()[None]
        for m in (eager, compiled):
            m.zero_grad()
            with shape_stable_attention():
                out = m(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False)
                out.logits.float().logsumexp(-1).mean().backward()
        for a, b in ((eager.lm_head.weight.grad, compiled.lm_head.weight.grad),
                     (eager.model.layers[1].self_attn.q_proj.weight.grad,
                      compiled.model.layers[1].self_attn.q_proj.weight.grad)):
            assert ((a - b).norm() / a.norm()).item() < 1e-3
