"""The sampler's fused step (one compiled region on a GPU) picks what the eager ops pick."""
import pytest
import torch

from rlfleet.types import SamplingParams
from services.rollout.engines.sampling import TokenSampler, scaled_choose

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_fused_step_equals_the_eager_ops_with_the_same_seed(temperature):
    params = SamplingParams(temperature=temperature, max_new_tokens=4, seed=3)
    eager = TokenSampler(params, [1], torch.device("cpu"))
    fused = TokenSampler(params, [1], torch.device("cpu"), fused=scaled_choose)  # what torch.compile gets
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    for first in (True, False, False):
        tokens_e, logprobs_e = eager(logits, first=first)
        tokens_f, logprobs_f = fused(logits, first=first)
        assert torch.equal(tokens_e, tokens_f)
        assert torch.allclose(logprobs_e, logprobs_f, atol=1e-6)
        # the logprob is the log-softmax of the temperature-scaled logits at the chosen token
        expected = torch.log_softmax(logits / (temperature or 1.0), -1).gather(1, tokens_f[:, None])[:, 0]
        assert torch.allclose(logprobs_f, expected, atol=1e-5)


def test_filtered_sampling_never_takes_the_fused_step():
    calls = []
    params = SamplingParams(temperature=0.7, max_new_tokens=4, top_k=5, seed=1)
    sampler = TokenSampler(params, [1], torch.device("cpu"), fused=lambda *a: calls.append(a))
    tokens, _ = sampler(torch.randn(3, 50), first=False)
    assert calls == [] and tokens.shape == (3,)
