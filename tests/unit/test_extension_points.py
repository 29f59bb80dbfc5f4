"""Adding an advantage estimator is one module with one registration, loaded by `algorithm.plugins`."""
from __future__ import annotations

import textwrap

import pytest
import torch

from controller.sample_builder import SampleBuilder
from rlfleet.advantages import ADVANTAGE_ESTIMATORS
from rlfleet.advantages.token import AdvantageInputs
from rlfleet.config import load_config

pytestmark = pytest.mark.unit

PLUGIN = '''
from rlfleet.advantages import ADVANTAGE_ESTIMATORS, AdvantageEstimator


def doubled(rewards_G):
    """r - mean, times two."""
    mean = sum(rewards_G) / len(rewards_G) if rewards_G else 0.0
    return [2.0 * (r - mean) for r in rewards_G]


def last_token_only(batches, gamma, lam):
    """A token stage: the sample's reward on its last response token."""
    from rlfleet.advantages.token import AdvantageOutputs, token_rewards
    return [AdvantageOutputs(token_rewards(b.rewards_B, b.mask_B_T)) for b in batches]


ADVANTAGE_ESTIMATORS.register("test_doubled")(AdvantageEstimator(group=doubled))
ADVANTAGE_ESTIMATORS.register("test_last_token")(AdvantageEstimator(token=last_token_only))
'''


def test_an_estimator_added_in_its_own_module_is_configured_and_used(tmp_path, monkeypatch):
    (tmp_path / "my_estimators.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(overrides=["algorithm.plugins=[my_estimators]", "algorithm.advantage=test_doubled"])
    assert cfg.algorithm.advantage == "test_doubled"
    # The controller runs its group stage: [1, 0] -> mean 0.5 -> [2 * 0.5, 2 * -0.5].
    assert SampleBuilder(cfg.algorithm, max_new_tokens=8).estimator([1.0, 0.0]) == [1.0, -1.0]

    token = load_config(overrides=["algorithm.plugins=[my_estimators]",
                                   "algorithm.advantage=test_last_token"])
    estimator = ADVANTAGE_ESTIMATORS.get(token.algorithm.advantage)
    assert SampleBuilder(token.algorithm, max_new_tokens=8).estimator([1.0, 0.0]) == [0.0, 0.0]  # learner's
    # The learner runs its token stage: reward 0.5 lands on the last response token (position 2).
    (out,) = estimator.token([AdvantageInputs(torch.tensor([0.5]), torch.tensor([0.0]),
                                              torch.tensor([[0, 1, 1, 0]]))], 1.0, 1.0)
    assert out.advantages_B_T.tolist() == [[0.0, 0.0, 0.5, 0.0]]
