"""Adding a unit at any extension point is one module with one registration, loaded by
`algorithm.plugins`: advantage estimators, policy losses, rollout engines."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from controller.sample_builder import SampleBuilder
from rlfleet.advantages import ADVANTAGE_ESTIMATORS
from rlfleet.advantages.token import AdvantageInputs
from rlfleet.config import LearnerConfig, load_config
from rlfleet.extensions import KL_ESTIMATORS, LOSS_AGGREGATIONS, OFF_POLICY, POLICY_LOSSES, ROLLOUT_ENGINES
from rlfleet.types import PromptRequest, SamplingParams, TrainBatch, TrainSample

pytestmark = pytest.mark.unit

ESTIMATORS_PLUGIN = '''
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

# What docs/algorithms.md shows: the learner's modules are imported inside the function, so the
# processes that only check the name (the controller) never import the learner or torch.
POLICY_LOSS_PLUGIN = '''
from rlfleet.extensions import POLICY_LOSSES


def half_ppo(logprobs_B_T, old_logprobs_B_T, advantages_B_T, mask_B_T, clip):
    """PPO's clipped surrogate at half weight."""
    import dataclasses

    from services.learner.algorithms.policy_losses import ppo_clip
    terms = ppo_clip(logprobs_B_T, old_logprobs_B_T, advantages_B_T, mask_B_T, clip)
    return dataclasses.replace(terms, loss_B_T=0.5 * terms.loss_B_T)


POLICY_LOSSES.register("test_half_ppo")(half_ppo)
'''

ENGINE_PLUGIN = '''
from rlfleet.extensions import ROLLOUT_ENGINES


def greedy_engine(model_path, device, dtype, cfg, seed):
    """The transformers engine, always greedy: every sample of a group is the argmax continuation."""
    import dataclasses

    from services.rollout.engines.hf import HFEngine

    class GreedyEngine(HFEngine):
        def generate(self, prompts, params):
            return super().generate(prompts, dataclasses.replace(params, temperature=0.0))

    return GreedyEngine(model_path, device, dtype, cfg.max_batch_sequences)


ROLLOUT_ENGINES.register("test_greedy")(greedy_engine)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """Writes a plugin module on the path; the registries and sys.modules are restored afterwards, so
    the names it registers do not outlive the test."""
    for registry in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS, LOSS_AGGREGATIONS, OFF_POLICY,
                     ROLLOUT_ENGINES):
        monkeypatch.setattr(registry, "_units", dict(registry._units))
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_an_estimator_added_in_its_own_module_is_configured_and_used(plugin):
    plugin("my_estimators", ESTIMATORS_PLUGIN)
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


def _train_once(model_dir: Path, ckpt: Path, overrides: list[str]) -> dict[str, float]:
    from services.learner.learner import Learner

    algorithm = load_config(overrides=overrides).algorithm
    core = Learner(LearnerConfig(lr=1e-2), model_dir, torch.device("cpu"), torch.float32, ckpt, seed=0,
                   algorithm=algorithm, max_response_tokens=4)
    before = {k: v.clone() for k, v in core.model.state_dict().items()}
    rows = [([3, 4, 5], [6, 7, 8], 1.0), ([3, 4, 5], [9, 10], -1.0), ([11, 12], [13, 14, 15, 16], 1.0)]
    samples = [TrainSample(prompt_ids=p, response_ids=r, behaviour_logprobs=[-3.0] * len(r), advantage=a,
                           generation_version=0, reward=max(a, 0.0)) for p, r, a in rows]
    result = core.train(TrainBatch(step=1, samples=samples, expected_version=0))
    assert result.policy_version == 1
    after = core.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the policy did not train"
    return result.metrics


def test_a_policy_loss_added_in_its_own_module_trains_the_learner(plugin, tiny_model_dir, tmp_path):
    plugin("my_losses", POLICY_LOSS_PLUGIN)
    baseline = _train_once(tiny_model_dir, tmp_path / "a", [])
    half = _train_once(tiny_model_dir, tmp_path / "b",
                       ["algorithm.plugins=[my_losses]", "algorithm.policy_loss=test_half_ppo"])
    # Same model, same batch: the first (and only) optimizer step saw the plugin's loss.
    assert baseline["actor/pg_loss"] != 0.0
    assert half["actor/pg_loss"] == pytest.approx(0.5 * baseline["actor/pg_loss"], rel=1e-5)
    assert half["actor/grad_norm"] == pytest.approx(0.5 * baseline["actor/grad_norm"], rel=1e-4)


def test_a_rollout_engine_added_in_its_own_module_is_built_by_the_engine_factory(plugin, tiny_model_dir):
    plugin("my_engines", ENGINE_PLUGIN)
    cfg = load_config(overrides=["algorithm.plugins=[my_engines]", "rollout.backend=test_greedy"])
    # What `rlfleet serve rollout` does with rollout.backend (rlfleet/app/serve.py).
    engine = ROLLOUT_ENGINES.get(cfg.rollout.backend)(tiny_model_dir, torch.device("cpu"), torch.float32,
                                                     cfg.rollout, cfg.run.seed)
    try:
        (group,) = engine.generate([PromptRequest(request_id="a", prompt_ids=[6, 7, 8])],
                                   SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=1))
        # At temperature 1 the tiny random model's four samples differ; the plugin's engine is greedy.
        assert len({tuple(c.token_ids) for c in group.completions}) == 1
    finally:
        engine.close()


def test_checking_every_unit_name_imports_no_role_and_no_torch():
    """Config validation runs in every process, the controller's included."""
    code = textwrap.dedent('''
        import sys
        from rlfleet.config import load_config
        load_config(overrides=["algorithm.name=gspo", "algorithm.kl_estimator=k2", "algorithm.advantage=gae",
                               "algorithm.off_policy=decoupled", "rollout.backend=vllm"])
        print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "services", "controller"}))
    ''')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
