"""learner.compile: resolved per placement, and a compiler that fails leaves a learner that trains eager."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlfleet.learner_config import LearnerConfig
from services.learner.compile import compile_layers

pytestmark = pytest.mark.unit


def test_null_means_on_for_one_gpu_process_only():
    assert LearnerConfig().compile_on(on_gpu=True) is True
    assert LearnerConfig().compile_on(on_gpu=False) is False
    assert LearnerConfig(world_size=2).compile_on(on_gpu=True) is False
    assert LearnerConfig(compile=False).compile_on(on_gpu=True) is False
    assert LearnerConfig(compile=True).compile_on(on_gpu=False) is True


def _model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).train()


def test_a_failing_compiler_leaves_the_layers_eager_and_the_same():
    model, ids = _model(), torch.randint(0, 64, (2, 10))
    expected = model(input_ids=ids).logits
    assert compile_layers(model, torch.device("cpu"), backend="no_such_backend") is False
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)
    assert all(p.grad is None for p in model.parameters())  # the warm-up's gradients are dropped
    assert torch.equal(model(input_ids=ids).logits, expected)


def test_compiled_layers_give_the_eager_loss_and_gradients():
    """The real compiler on the CPU (the eager backend of Dynamo keeps the test fast: the same graph
    capture, guards and dynamic shapes, without code generation; the GPU test compiles with inductor)."""
    eager, compiled = _model(), _model()
    assert compile_layers(compiled, torch.device("cpu"), backend="aot_eager") is True
    assert all(layer._compiled_call_impl is not None for layer in compiled.model.layers)
    for width in (9, 13):  # a second shape: dynamic, no error
        ids = torch.randint(0, 64, (3, width))
        for m in (eager, compiled):
            m.zero_grad()
            m(input_ids=ids).logits.float().pow(2).mean().backward()
        assert torch.allclose(eager.lm_head.weight.grad, compiled.lm_head.weight.grad, atol=1e-5)
        assert torch.allclose(eager.model.layers[0].mlp.up_proj.weight.grad,
                              compiled.model.layers[0].mlp.up_proj.weight.grad, atol=1e-5)
