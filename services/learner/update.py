"""One Train call: prepare, estimate advantages, then PPO-style updates over mini-batches.

1. Prepare (no gradient), one micro-batch at a time: the learner's own log-probs before the
   update when an off-policy correction or the KL-in-reward needs them, the reference's
   log-probs when there is a KL, and the critic's values when the estimator needs them.
2. Advantages for the whole train batch at once (whitening is over the batch), by the
   registered learner-side estimator.
3. ``ppo_epochs`` passes over ``mini_batches`` mini-batches, each one optimizer step of the
   policy (and of the critic). However many steps, one Train call is one policy version.

Aggregation weights divide by mini-batch counts, so gradient accumulation over micro-batches
is exact. Metrics are token means over every micro-batch pass (grad norms: means over steps).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from rlfleet.advantages import ADVANTAGE_ESTIMATORS
from rlfleet.advantages.token import AdvantageInputs, broadcast
from rlfleet.algorithm import AlgorithmConfig
from rlfleet.extensions import KL_ESTIMATORS, LOSS_AGGREGATIONS, OFF_POLICY
from rlfleet.types import TrainBatch
from services.learner.algorithms.aggregation import BatchCounts
from services.learner.algorithms.objective import ObjectiveSettings, micro_batch_objective
from services.learner.algorithms.policy_losses import ClipSettings
from services.learner.batching import MicroBatch, collate, split_by_token_budget, split_mini_batches
from services.learner.critic import Critic
from services.learner.forward import PLAIN, ForwardSettings, policy_logprobs, shape_stable_attention
from services.learner.loss import masked_token_mean, mismatch_stats
from services.learner.packing import split_by_packed_budget
from services.learner.reference import model_logprobs


@dataclass
class Prepared:
    mb: MicroBatch
    old_logprobs_B_T: torch.Tensor | None = None
    ref_logprobs_B_T: torch.Tensor | None = None
    values_B_T: torch.Tensor | None = None
    kl_penalty_B_T: torch.Tensor | None = None
    advantages_B_T: torch.Tensor | None = None
    returns_B_T: torch.Tensor | None = None


#: per-micro-batch metrics whose step value is their largest, not their token mean
MAX_METRICS = frozenset({"mismatch/abs_logprob_diff_max"})


def mismatch_metrics(learner_logprobs_B_T: torch.Tensor, mb: MicroBatch) -> dict[str, torch.Tensor]:
    """The training-inference mismatch of a micro-batch (services/learner/loss.mismatch_stats); the
    mean also under its older name rollout/logprob_diff_mean, which dashboards read."""
    stats = mismatch_stats(learner_logprobs_B_T.detach(), mb.behaviour_logprobs_B_T, mb.response_mask_B_T)
    stats["rollout/logprob_diff_mean"] = stats["mismatch/abs_logprob_diff_mean"]
    return stats


class _Means:
    """Token-weighted means of per-micro-batch metrics, plus plain means of per-step ones.

    Values stay where they are (device tensors are summed on the device) until `result`: reading a
    metric per micro-batch would synchronise the host with the GPU each time and leave the GPU idle
    while the next micro-batch's kernels are launched."""

    def __init__(self) -> None:
        self.token_sums: dict[str, torch.Tensor | float] = defaultdict(float)
        self.token_counts: dict[str, float] = defaultdict(float)
        self.step_values: dict[str, list[torch.Tensor | float]] = defaultdict(list)
        self.maxima: dict[str, torch.Tensor] = {}

    def add_tokens(self, metrics: dict[str, torch.Tensor | float], tokens: int) -> None:
        for key, value in metrics.items():
            if key in MAX_METRICS:  # the largest over the step, not a mean
                value = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
                self.maxima[key] = torch.maximum(self.maxima[key], value) if key in self.maxima else value
                continue
            value = value.detach().double() if isinstance(value, torch.Tensor) else float(value)
            self.token_sums[key] = self.token_sums[key] + value * tokens
            self.token_counts[key] += tokens

    def add_step(self, metrics: dict[str, torch.Tensor | float]) -> None:
        for key, value in metrics.items():
            self.step_values[key].append(value.detach() if isinstance(value, torch.Tensor) else float(value))

    def result(self) -> dict[str, float]:
        out = {k: float(s) / max(self.token_counts[k], 1) for k, s in self.token_sums.items()}
        out.update({k: sum(float(x) for x in v) / len(v) for k, v in self.step_values.items()})
        out.update({k: float(v) for k, v in self.maxima.items()})
        return out


class PolicyUpdate:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, algo: AlgorithmConfig, *,
                 grad_clip: float, micro_batch_tokens: int, pad_id: int, device: torch.device,
                 loss_scale_tokens: int, reference=None, critic: Critic | None = None,
                 forward: ForwardSettings = PLAIN):
        self.model, self.optimizer, self.algo = model, optimizer, algo
        self.grad_clip, self.micro_batch_tokens = grad_clip, micro_batch_tokens
        self.pad_id, self.device = pad_id, device
        self.loss_scale_tokens = loss_scale_tokens
        self.reference, self.critic = reference, critic
        self.forward = forward  # how logits and inputs are laid out (services/learner/forward.py)
        self.estimator = ADVANTAGE_ESTIMATORS.get(algo.advantage)
        self.correction = OFF_POLICY.get(algo.off_policy)
        self.weights_of = LOSS_AGGREGATIONS.get(algo.loss_agg)
        self.kl_of = KL_ESTIMATORS.get(algo.kl_estimator)
        if algo.kl_coef > 0 and reference is None:
            raise ValueError("algorithm.kl_coef > 0 needs a reference model")
        if self.estimator.needs_values and critic is None:
            raise ValueError(f"advantage estimator {algo.advantage!r} needs a critic")
        self.objective = ObjectiveSettings(
            policy_loss=algo.policy_loss,
            clip=ClipSettings(algo.clip_low, algo.clip_high, algo.clip_ratio_c),
            kl_coef=0.0 if algo.kl_in_reward else algo.kl_coef, kl_estimator=algo.kl_estimator,
            entropy_coef=algo.entropy_coef)

    # ---- 1. prepare -----------------------------------------------------------------------
    @torch.no_grad()
    def _prepare(self, mb: MicroBatch, temperature: float, means: _Means) -> Prepared:
        p = Prepared(mb)
        if self.correction.recomputes_old or self.algo.kl_in_reward:
            p.old_logprobs_B_T = model_logprobs(self.model, mb, temperature, self.forward)
            means.add_tokens(mismatch_metrics(p.old_logprobs_B_T, mb), mb.num_tokens)
        if self.reference is not None:
            p.ref_logprobs_B_T = self.reference.logprobs(mb, temperature, self.forward)
        if self.algo.kl_in_reward:
            p.kl_penalty_B_T = self.algo.kl_coef * self.kl_of(p.old_logprobs_B_T, p.ref_logprobs_B_T)
            means.add_tokens(
                {"actor/reward_kl_penalty": masked_token_mean(p.kl_penalty_B_T, mb.response_mask_B_T)},
                mb.num_tokens)
        if self.critic is not None:
            p.values_B_T = self.critic.values(mb)
        return p

    # ---- 2. advantages --------------------------------------------------------------------
    def _estimate(self, prepared: list[Prepared], means: _Means) -> None:
        outputs = (self.estimator.token or broadcast)(
            [AdvantageInputs(p.mb.rewards_B, p.mb.advantages_B, p.mb.response_mask_B_T, p.kl_penalty_B_T,
                             p.values_B_T) for p in prepared], self.algo.gamma, self.algo.lam)
        for p, out in zip(prepared, outputs):
            p.advantages_B_T, p.returns_B_T = out.advantages_B_T, out.returns_B_T
            stats = {"actor/advantages_mean": masked_token_mean(out.advantages_B_T, p.mb.response_mask_B_T)}
            if out.returns_B_T is not None:
                stats["critic/returns_mean"] = masked_token_mean(out.returns_B_T, p.mb.response_mask_B_T)
                stats["critic/values_mean"] = masked_token_mean(p.values_B_T, p.mb.response_mask_B_T)
            means.add_tokens(stats, p.mb.num_tokens)

    # ---- 3. updates -----------------------------------------------------------------------
    def _backward(self, p: Prepared, counts: BatchCounts, temperature: float, first_pass: bool) -> dict:
        """Forward, loss and backward of one micro-batch (gradients accumulate); returns its metrics."""
        mb = p.mb
        # The entropy is always a metric; it is differentiated only when it is in the loss.
        logprobs_B_T, entropy_B_T = policy_logprobs(self.model, mb, temperature, self.forward,
                                                    entropy_grad=self.algo.entropy_coef > 0)
        correction = self.correction.apply(mb.behaviour_logprobs_B_T, p.old_logprobs_B_T,
                                           mb.response_mask_B_T,
                                           self.algo.is_cap)
        out = micro_batch_objective(logprobs_B_T, p.advantages_B_T, mb.response_mask_B_T,
                                    self.weights_of(mb.response_mask_B_T, counts), correction, self.objective,
                                    ref_logprobs_B_T=p.ref_logprobs_B_T, entropy_B_T=entropy_B_T)
        out.loss.backward()
        metrics = dict(out.metrics)
        if first_pass and p.old_logprobs_B_T is None:
            # Without a recomputation pass the learner's pre-update log-probs are these
            # (exactly so for the first mini-batch).
            metrics.update(mismatch_metrics(logprobs_B_T, mb))
        return metrics

    def _policy_step(self, mini: list[Prepared], counts: BatchCounts, temperature: float, first_pass: bool,
                     means: _Means) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for p in mini:
            means.add_tokens(self._backward(p, counts, temperature, first_pass), p.mb.num_tokens)
        params = [q for q in self.model.parameters() if q.grad is not None]
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        self.optimizer.step()
        means.add_step({"actor/grad_norm": grad_norm})

    def run(self, batch: TrainBatch) -> dict[str, float]:
        with shape_stable_attention():
            return self._run(batch)

    def _run(self, batch: TrainBatch) -> dict[str, float]:
        means = _Means()
        pack = self.forward.pack_sequences
        split = split_by_packed_budget if pack else split_by_token_budget
        minis = [[self._prepare(collate(chunk, self.pad_id, self.device, pack), batch.temperature, means)
                  for chunk in split(mini, self.micro_batch_tokens)]
                 for mini in split_mini_batches(batch.samples, self.algo.mini_batches)]
        self._estimate([p for mini in minis for p in mini], means)
        for epoch in range(self.algo.ppo_epochs):
            for mini in minis:
                counts = BatchCounts.of([p.mb.response_mask_B_T for p in mini], self.loss_scale_tokens)
                self._policy_step(mini, counts, batch.temperature, epoch == 0, means)
                if self.critic is not None:
                    means.add_step(self.critic.update(
                        [(p.mb, p.values_B_T, p.returns_B_T, self.weights_of(p.mb.response_mask_B_T, counts))
                         for p in mini], counts.num_tokens))
        metrics = means.result()
        metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["learner/tokens"] = float(sum(len(s.response_ids) for s in batch.samples))  # processed
        # trained on (the token mean's count): a multi-turn response's observation tokens are context only
        metrics["learner/trained_tokens"] = float(sum(sum(s.loss_mask) if s.loss_mask is not None
                                                      else len(s.response_ids) for s in batch.samples))
        metrics["learner/micro_batches"] = float(sum(len(m) for m in minis))
        metrics["learner/optimizer_steps"] = float(self.algo.ppo_epochs * len(minis))
        return metrics


def build_policy_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, algo: AlgorithmConfig,
                        learner_cfg, *, model_path, device: torch.device, dtype: torch.dtype, pad_id: int,
                        max_response_tokens: int) -> PolicyUpdate:
    """A PolicyUpdate with the reference and critic the algorithm asks for (and no others)."""
    from services.learner.lora import is_lora
    from services.learner.reference import AdapterDisabledReference, FrozenCopyReference

    reference = None
    if algo.kl_coef > 0:
        reference = AdapterDisabledReference(model) if is_lora(model) else FrozenCopyReference(model)
    critic = None
    if ADVANTAGE_ESTIMATORS.get(algo.advantage).needs_values:
        critic = Critic(model_path, device, dtype, lr=algo.critic_lr or learner_cfg.lr,
                        betas=learner_cfg.betas,
                        weight_decay=learner_cfg.weight_decay, grad_clip=learner_cfg.grad_clip,
                        value_clip=algo.value_clip)
    return PolicyUpdate(model, optimizer, algo, grad_clip=learner_cfg.grad_clip,
                        micro_batch_tokens=learner_cfg.micro_batch_tokens_on(device.type == "cuda"),
                        pad_id=pad_id, device=device,
                        loss_scale_tokens=algo.loss_scale_tokens or max_response_tokens,
                        reference=reference, critic=critic, forward=ForwardSettings.of(learner_cfg, device))
