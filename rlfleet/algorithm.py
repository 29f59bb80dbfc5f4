"""The `algorithm` config section (and `learner.lora`): which RL algorithm a job trains with.

`algorithm.name` is a preset: it sets defaults for the individual knobs, and any knob
given explicitly (in the YAML file or as `algorithm.KNOB=...`) wins over the preset.
The knobs that name units are strings checked against a registry the core holds
(rlfleet.advantages, rlfleet.extensions), after `algorithm.plugins` has registered more;
docs/algorithms.md lists every knob, its default and the paper or framework it follows.
"""
from __future__ import annotations

import importlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rlfleet.advantages import ADVANTAGE_ESTIMATORS
from rlfleet.extensions import KL_ESTIMATORS, LOSS_AGGREGATIONS, OFF_POLICY, POLICY_LOSSES
from rlfleet.registry import Registry

PresetName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo", "dapo", "gspo"]

# What each preset changes relative to the field defaults (which are plain GRPO).
PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {},
    # Dr. GRPO (Liu et al. 2025): no std normalisation, and a constant token normaliser
    # instead of each response's length, which removes GRPO's length bias.
    "dr_grpo": {"advantage": "dr_grpo", "loss_agg": "seq-mean-token-sum-norm"},
    "rloo": {"advantage": "rloo"},
    # REINFORCE++ (Hu 2025): token-level KL penalty in the reward, batch-normalised returns.
    "reinforce_pp": {"advantage": "reinforce_pp", "kl_coef": 0.001, "kl_in_reward": True,
                     "kl_estimator": "k1"},
    # PPO with a critic: GAE advantages, a learned value model, two mini-batches per step
    # so the clipped ratio actually departs from 1.
    "ppo": {"advantage": "gae", "mini_batches": 2},
    # DAPO (Yu et al. 2025): clip-higher, dynamic sampling, soft overlong punishment, token-mean.
    "dapo": {"clip_high": 0.28, "dynamic_sampling": True, "overlong_buffer_ratio": 0.25,
             "loss_agg": "token-mean"},
    # GSPO (Zheng et al. 2025): sequence-level ratio with the paper's tiny clip ranges.
    "gspo": {"policy_loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"},
}


# The registry each unit-naming knob is checked against.
UNIT_REGISTRIES: dict[str, Registry[Any]] = {
    "advantage": ADVANTAGE_ESTIMATORS, "policy_loss": POLICY_LOSSES, "loss_agg": LOSS_AGGREGATIONS,
    "kl_estimator": KL_ESTIMATORS, "off_policy": OFF_POLICY}


def load_plugins(modules: object) -> None:
    """Imports the modules of `algorithm.plugins`, which register more units (any extension point).
    Anything but a list of strings is left to the field's own validation to report."""
    if not isinstance(modules, list):
        return
    for module in modules:
        if not isinstance(module, str):
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure of a user's module is a config error
            raise ValueError(f"algorithm.plugins: cannot import {module!r}: {type(exc).__name__}: {exc}") \
                from None


def registered(registry: Registry[Any], name: str) -> str:
    """`name` if the registry has it, else the one-line error pydantic prefixes with the key."""
    if name not in registry:
        raise ValueError(f"{registry.unknown(name)} (more with algorithm.plugins)")
    return name


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class AlgorithmConfig(_Section):
    name: PresetName = Field("grpo", description="preset that sets the defaults of the knobs below")
    plugins: list[str] = Field(default_factory=list, description="modules imported (in every process) before "
                               "any unit name of the config is checked: they register more advantage "
                               "estimators, policy losses, KL estimators, loss aggregations, off-policy "
                               "corrections or rollout engines (docs/algorithms.md)")
    advantage: str = Field("grpo", description="a registered advantage estimator "
                           "(rlfleet/advantages/): grpo, dr_grpo and rloo run in the controller (they need "
                           "groups), reinforce_pp and gae in the learner")
    policy_loss: str = Field("ppo_clip", description="per-token policy loss, a name registered in "
                             "rlfleet.extensions.POLICY_LOSSES (docs/algorithms.md lists them)")
    loss_agg: str = Field("token-mean", description="how per-token losses become one number, a name "
                          "registered in rlfleet.extensions.LOSS_AGGREGATIONS")
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="ratio clipped below at 1 - clip_low")
    clip_high: float = Field(0.2, ge=0.0, description="ratio clipped above at 1 + clip_high "
                             "(DAPO clip-higher: clip_high > clip_low)")
    clip_ratio_c: float | None = Field(None, gt=1.0, description="dual clip: bound the loss of negative-"
                                       "advantage tokens at -A * clip_ratio_c; null disables")
    kl_coef: float = Field(0.0, ge=0.0, description="weight of the KL to the frozen reference; 0 loads no "
                           "reference model")
    kl_estimator: str = Field("k3", description="per-token KL estimator (Schulman's k1, k2, k3), a name "
                              "registered in rlfleet.extensions.KL_ESTIMATORS")
    kl_in_reward: bool = Field(False, description="subtract kl_coef * KL from the reward of every token "
                               "instead of adding it to the loss")
    entropy_coef: float = Field(0.0, ge=0.0, description="entropy bonus: loss -= entropy_coef * entropy")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount of token rewards (gae, reinforce_pp, "
                         "KL-in-reward)")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda")
    critic_lr: float | None = Field(None, gt=0.0, lt=1.0,
                                    description="critic learning rate; null: learner.lr")
    value_clip: float | None = Field(0.5, gt=0.0, description="clip new values to old +- value_clip in the "
                                     "value loss; null disables")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per train batch (PPO mini-batches); "
                              "one Train call still advances the policy version by one")
    ppo_epochs: int = Field(1, ge=1, description="passes over the train batch")
    off_policy: str = Field("none", description="none: clip the ratio to the behaviour (rollout) "
                            "policy; tis: recompute old logprobs and truncate the rollout importance "
                            "weight; decoupled: AReaL's decoupled PPO (names registered in "
                            "rlfleet.extensions.OFF_POLICY)")
    is_cap: float = Field(2.0, gt=0.0, description="tis: importance weights are truncated at is_cap; "
                          "decoupled: tokens whose weight exceeds is_cap are dropped")
    dynamic_sampling: bool = Field(False, description="drop groups whose rewards are all equal and keep "
                                   "generating until the batch is full (DAPO)")
    max_gen_batches: int = Field(10, ge=0, description="dynamic sampling gives up (an error) after dropping "
                                 "this many batches' worth of groups in one step; 0 never gives up")
    overlong_buffer_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="DAPO soft overlong punishment: "
                                         "the last ratio * rollout.max_new_tokens tokens are a penalty zone; "
                                         "0 disables")
    overlong_penalty: float = Field(1.0, ge=0.0, description="penalty at (and beyond) rollout.max_new_tokens")
    loss_scale_tokens: int | None = Field(None, ge=1, description="constant token normaliser of "
                                          "seq-mean-token-sum-norm; null: rollout.max_new_tokens")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        load_plugins(data.get("plugins"))
        preset = PRESETS.get(data.get("name", "grpo"))
        if preset is None:
            return data  # the Literal check on `name` reports it
        return {**preset, **data}

    @field_validator("advantage", "policy_loss", "loss_agg", "kl_estimator", "off_policy")
    @classmethod
    def _registered(cls, name: str, info: ValidationInfo) -> str:
        return registered(UNIT_REGISTRIES[info.field_name], name)

    @model_validator(mode="after")
    def _check(self) -> AlgorithmConfig:
        if self.kl_in_reward and self.kl_coef == 0.0:
            raise ValueError("algorithm.kl_in_reward needs algorithm.kl_coef > 0")
        return self

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0.0


class LoraConfig(_Section):
    rank: int = Field(0, ge=0, description="LoRA rank of the policy; 0 trains every weight")
    alpha: float = Field(16.0, gt=0.0, description="LoRA scaling numerator (scale = alpha / rank)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the LoRA adapters' input")
    target_modules: list[str] | str = Field("all-linear", description="module names to adapt, or all-linear")
