"""The `algorithm` section: presets set defaults, explicit knobs win, every name is a registered unit."""
from __future__ import annotations

from typing import get_args

import pytest

from rlfleet.advantages import ADVANTAGE_ESTIMATORS
from rlfleet.algorithm import PRESETS, AlgorithmConfig, PresetName
from rlfleet.config import load_config
from rlfleet.errors import ConfigError
from rlfleet.extensions import KL_ESTIMATORS, LOSS_AGGREGATIONS, OFF_POLICY, POLICY_LOSSES, ROLLOUT_ENGINES
from services.learner.algorithms.off_policy import OffPolicyCorrection

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


@pytest.mark.parametrize(("registry", "names"), [
    (POLICY_LOSSES, ["gspo", "nll", "ppo_clip"]),
    (LOSS_AGGREGATIONS,
     ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-mean"]),
    (KL_ESTIMATORS, ["k1", "k2", "k3"]),
    (OFF_POLICY, ["decoupled", "none", "tis"]),
    (ROLLOUT_ENGINES, ["hf", "vllm"]),
])
def test_every_built_in_name_loads_its_unit_from_its_role(registry, names) -> None:
    """The core registers built-in units by import path; each path must name a real unit."""
    assert registry.names() == names
    for name in names:
        unit = registry.get(name)
        assert isinstance(unit, OffPolicyCorrection) if registry is OFF_POLICY else callable(unit), name


@pytest.mark.parametrize(("key", "kind", "known"), [
    ("algorithm.policy_loss", "policy loss", "gspo, nll, ppo_clip"),
    ("algorithm.loss_agg", "loss aggregation", "seq-mean-token-sum-norm, token-mean"),
    ("algorithm.kl_estimator", "KL estimator", "k1, k2, k3"),
    ("algorithm.off_policy", "off-policy correction", "decoupled, none, tis"),
    ("rollout.backend", "rollout engine", "hf, vllm"),
])
def test_an_unknown_unit_name_is_a_one_line_error_naming_the_key_and_the_known_names(key, kind, known):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{key}=nope"])
    message = str(err.value)
    assert "\n" not in message
    assert f"{key} = 'nope'" in message and f"unknown {kind} 'nope'; registered: " in message
    assert known in message and "more with algorithm.plugins" in message


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

