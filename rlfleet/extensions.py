"""The registries of the extension points the job config names, other than the advantage
estimators (rlfleet.advantages): the learner's policy losses, KL estimators, loss aggregations and
off-policy corrections, and the rollout engines.

A unit's code lives in the role that runs it (services/learner/algorithms/, services/rollout/engines/)
and imports torch, so the built-in units are registered here by import path: every process (the
controller too) checks `algorithm.policy_loss`, `rollout.backend`, ... against these names without
importing a role or torch, and the role imports a unit on its first `get`. Adding one is its module
plus one line here; a module outside rlfleet registers itself from `algorithm.plugins`
(docs/algorithms.md, "Adding a unit").
"""
from __future__ import annotations

from typing import Any

from rlfleet.registry import Registry

_LEARNER = "services.learner.algorithms"

# (logprobs, old_logprobs, advantages, mask, ClipSettings) -> PolicyTerms, all [B, T]
# (services/learner/algorithms/policy_losses.py)
POLICY_LOSSES: Registry[Any] = Registry("policy loss")
POLICY_LOSSES.register_path("ppo_clip", f"{_LEARNER}.policy_losses:ppo_clip")
POLICY_LOSSES.register_path("gspo", f"{_LEARNER}.policy_losses:gspo")
POLICY_LOSSES.register_path("nll", f"{_LEARNER}.policy_losses:nll")  # rlfleet sft

# (logprobs, ref_logprobs) -> per-token KL estimate (services/learner/algorithms/kl.py)
KL_ESTIMATORS: Registry[Any] = Registry("KL estimator")
KL_ESTIMATORS.register_path("k1", f"{_LEARNER}.kl:kl_k1")
KL_ESTIMATORS.register_path("k2", f"{_LEARNER}.kl:kl_k2")
KL_ESTIMATORS.register_path("k3", f"{_LEARNER}.kl:kl_k3")

# (mask, BatchCounts) -> per-token loss weights (services/learner/algorithms/aggregation.py)
LOSS_AGGREGATIONS: Registry[Any] = Registry("loss aggregation")
LOSS_AGGREGATIONS.register_path("token-mean", f"{_LEARNER}.aggregation:token_mean_weights")
LOSS_AGGREGATIONS.register_path("seq-mean-token-sum", f"{_LEARNER}.aggregation:seq_mean_token_sum_weights")
LOSS_AGGREGATIONS.register_path("seq-mean-token-mean", f"{_LEARNER}.aggregation:seq_mean_token_mean_weights")
LOSS_AGGREGATIONS.register_path("seq-mean-token-sum-norm",
                                f"{_LEARNER}.aggregation:seq_mean_token_sum_norm_weights")

# OffPolicyCorrection instances (services/learner/algorithms/off_policy.py)
OFF_POLICY: Registry[Any] = Registry("off-policy correction")
OFF_POLICY.register_path("none", f"{_LEARNER}.off_policy:NO_CORRECTION")
OFF_POLICY.register_path("tis", f"{_LEARNER}.off_policy:TRUNCATED_IS")
OFF_POLICY.register_path("decoupled", f"{_LEARNER}.off_policy:DECOUPLED_PPO")

# (model folder, torch device, torch dtype, the `rollout` config section, run seed) -> a
# services.rollout.engine.RolloutEngine; chosen by `rollout.backend`
ROLLOUT_ENGINES: Registry[Any] = Registry("rollout engine")
ROLLOUT_ENGINES.register_path("hf", "services.rollout.engines.hf:create_engine")
ROLLOUT_ENGINES.register_path("vllm", "services.rollout.engines.vllm:create_engine")
