"""The `algorithm` section: presets set defaults, explicit knobs win, every name is a registered unit."""
from __future__ import annotations

from typing import get_args

import pytest

from rlfleet.algorithm import (
    PRESETS,
    AlgorithmConfig,
    KLEstimatorName,
    LossAggName,
    OffPolicyName,
    PolicyLossName,
    PresetName,
)
from rlfleet.advantages import ADVANTAGE_ESTIMATORS
from rlfleet.config import load_config
from rlfleet.errors import ConfigError
from services.learner.algorithms.aggregation import LOSS_AGGREGATIONS
from services.learner.algorithms.kl import KL_ESTIMATORS
from services.learner.algorithms.off_policy import OFF_POLICY
from services.learner.algorithms.policy_losses import POLICY_LOSSES

pytestmark = pytest.mark.unit


def test_default_is_plain_grpo() -> None:
    cfg = load_config().algorithm
    assert cfg == AlgorithmConfig(name="grpo")
    assert (cfg.advantage, cfg.policy_loss, cfg.loss_agg,
            cfg.off_policy) == ("grpo", "ppo_clip", "token-mean", "none")
    assert (cfg.clip_low, cfg.clip_high, cfg.kl_coef, cfg.dynamic_sampling) == (0.2, 0.2, 0.0, False)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_sets_its_knobs(name: str) -> None:
    cfg = load_config(overrides=[f"algorithm.name={name}"]).algorithm
    for key, value in PRESETS[name].items():
        assert getattr(cfg, key) == value, key


def test_explicit_knobs_win_over_the_preset(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("algorithm:\n  name: dr_grpo\n  loss_agg: token-mean\n")
    cfg = load_config(path, ["algorithm.clip_high=0.3"]).algorithm
    assert cfg.advantage == "dr_grpo"  # from the preset
    assert cfg.loss_agg == "token-mean"  # the file beats the preset
    assert cfg.clip_high == 0.3  # an override beats both


def test_moved_learner_keys_point_to_the_algorithm_section() -> None:
    with pytest.raises(ConfigError, match="learner.kl_coef moved to algorithm.kl_coef"):
        load_config(overrides=["learner.kl_coef=0.1"])


@pytest.mark.parametrize(("override", "match"), [
    ("algorithm.name=ppo2", "algorithm.name"),
    ("algorithm.loss_agg=token_mean", "algorithm.loss_agg"),
    ("algorithm.clip_ratio_c=0.5", "algorithm.clip_ratio_c"),
    ("algorithm.kl_in_reward=true", "kl_in_reward needs algorithm.kl_coef"),
])
def test_bad_values_name_the_key(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=[override])


@pytest.mark.parametrize(("names", "registry"), [
    (PolicyLossName, POLICY_LOSSES), (LossAggName, LOSS_AGGREGATIONS), (KLEstimatorName, KL_ESTIMATORS),
    (OffPolicyName, OFF_POLICY),
])
def test_every_config_name_is_a_registered_unit(names, registry) -> None:
    assert sorted(get_args(names)) == registry.names()


def test_the_advantage_name_is_checked_against_the_one_registry() -> None:
    assert ADVANTAGE_ESTIMATORS.names() == ["dr_grpo", "gae", "grpo", "reinforce_pp", "rloo"]
    with pytest.raises(ConfigError, match="algorithm.advantage.*unknown advantage estimator 'grpo2'.*rloo"):
        load_config(overrides=["algorithm.advantage=grpo2"])
    with pytest.raises(ConfigError, match="algorithm.plugins: cannot import 'no_such_module'"):
        load_config(overrides=["algorithm.plugins=[no_such_module]"])


def test_every_preset_is_a_valid_config() -> None:
    assert sorted(PRESETS) == sorted(get_args(PresetName))
    for name in PRESETS:
        AlgorithmConfig(name=name)


def test_every_rollout_backend_is_a_registered_engine() -> None:
    from rlfleet.config import RolloutConfig
    from services.rollout.engines import ENGINES

    assert sorted(get_args(RolloutConfig.model_fields["backend"].annotation)) == ENGINES.names()
