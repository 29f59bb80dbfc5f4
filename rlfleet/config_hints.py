"""What an unknown config key probably meant: a close rlfleet key ("did you mean"), or, for a key in
verl's layout (`actor_rollout_ref.actor.optim.lr`), its rlfleet name. The table is also in
docs/from-verl.md (tests/unit/test_config_hints.py keeps the two the same)."""
from __future__ import annotations

import difflib
from typing import Any

# verl key (ppo_trainer.yaml) -> the rlfleet key that does the same, with a note where they differ.
VERL_KEYS: dict[str, str] = {
    "actor_rollout_ref.model.path": "model.path",
    "actor_rollout_ref.model.lora_rank": "learner.lora.rank",
    "actor_rollout_ref.model.lora_alpha": "learner.lora.alpha",
    "actor_rollout_ref.model.target_modules": "learner.lora.target_modules",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "learner.gradient_checkpointing",
    "actor_rollout_ref.actor.optim.lr": "learner.lr",
    "actor_rollout_ref.actor.optim.weight_decay": "learner.weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "learner.lr_warmup_steps",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "learner.lr_warmup_ratio",
    "actor_rollout_ref.actor.optim.min_lr_ratio": "learner.min_lr_ratio",
    "actor_rollout_ref.actor.optim.warmup_style": "learner.lr_scheduler",
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "learner.lr_scheduler",
    "actor_rollout_ref.actor.grad_clip": "learner.grad_clip",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu":
        "learner.micro_batch_tokens (tokens, not samples)",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "algorithm.mini_batches (how many, not their size)",
    "actor_rollout_ref.actor.ppo_epochs": "algorithm.ppo_epochs",
    "actor_rollout_ref.actor.clip_ratio": "algorithm.clip_low and algorithm.clip_high",
    "actor_rollout_ref.actor.clip_ratio_low": "algorithm.clip_low",
    "actor_rollout_ref.actor.clip_ratio_high": "algorithm.clip_high",
    "actor_rollout_ref.actor.clip_ratio_c": "algorithm.clip_ratio_c",
    "actor_rollout_ref.actor.use_kl_loss": "algorithm.kl_coef (above 0 turns the KL loss on)",
    "actor_rollout_ref.actor.kl_loss_coef": "algorithm.kl_coef",
    "actor_rollout_ref.actor.kl_loss_type": "algorithm.kl_estimator",
    "actor_rollout_ref.actor.entropy_coeff": "algorithm.entropy_coef",
    "actor_rollout_ref.actor.loss_agg_mode": "algorithm.loss_agg",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "algorithm.policy_loss",
    "actor_rollout_ref.rollout.name": "rollout.backend",
    "actor_rollout_ref.rollout.n": "rollout.n",
    "actor_rollout_ref.rollout.temperature": "rollout.temperature",
    "actor_rollout_ref.rollout.top_p": "rollout.top_p",
    "actor_rollout_ref.rollout.top_k": "rollout.top_k",
    "actor_rollout_ref.rollout.response_length": "rollout.max_new_tokens",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "rollout.tensor_parallel_size",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.max_model_len": "rollout.max_model_len",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": "rollout.max_turns",
    "actor_rollout_ref.rollout.multi_turn.enable": "env.name or env.address (an environment makes episodes "
                                                   "multi-turn)",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": "env.name or env.address (the tools are an "
                                                             "environment server's)",
    "actor_rollout_ref.rollout.val_kwargs.n": "controller.eval_n",
    "data.train_batch_size": "controller.prompts_per_step",
    "data.max_response_length": "rollout.max_new_tokens",
    "algorithm.adv_estimator": "algorithm.advantage",
    "algorithm.kl_ctrl.kl_coef": "algorithm.kl_coef",
    "algorithm.use_kl_in_reward": "algorithm.kl_in_reward",
    "algorithm.filter_groups.enable": "algorithm.dynamic_sampling",
    "algorithm.filter_groups.max_num_gen_batches": "algorithm.max_gen_batches",
    "critic.optim.lr": "algorithm.critic_lr",
    "reward_model.model.path": "reward.model.path",
    "custom_reward_function.path": "reward.fn (module:function)",
    "trainer.total_training_steps": "controller.max_steps",
    "trainer.total_epochs": "controller.max_steps (steps, not epochs)",
    "trainer.save_freq": "learner.checkpoint_every",
    "trainer.test_freq": "controller.eval_every",
    "trainer.val_before_train": "controller.eval_before_train",
    "trainer.resume_mode": "controller.resume",
    "trainer.project_name": "tracking.wandb_project",
    "trainer.experiment_name": "run.name",
    "trainer.default_local_dir": "run.output_dir",
    "trainer.logger": "tracking.tensorboard and tracking.wandb",
}
GUIDE = "docs/from-verl.md"
VERL_SECTIONS = {"actor_rollout_ref", "trainer", "critic", "reward_model", "custom_reward_function"}


def leaf_keys(value: Any, prefix: str) -> list[str]:
    """`{"actor": {"optim": {"lr": 1}}}` under `actor_rollout_ref` -> `actor_rollout_ref.actor.optim.lr`."""
    if not isinstance(value, dict) or not value:
        return [prefix]
    return [leaf for key, child in value.items() for leaf in leaf_keys(child, f"{prefix}.{key}")]


def describe_unknown_key(key: str, value: Any, known: list[str]) -> str:
    """The error line for the unknown key `key` (its value `value`); `known`: every rlfleet key, dotted."""
    leaves = leaf_keys(value, key)
    verl = [(leaf, VERL_KEYS[leaf]) for leaf in leaves if leaf in VERL_KEYS]
    unmapped = [leaf for leaf in leaves if leaf not in VERL_KEYS]
    if len(verl) == 1 and not unmapped:
        return f"unknown config key {verl[0][0]!r}: verl's name for {verl[0][1]} (the whole table: {GUIDE})"
    if verl:
        named = "; ".join(f"{leaf} is {ours}" for leaf, ours in verl[:3])
        more = f" (and {len(verl) - 3} more)" if len(verl) > 3 else ""
        rest = (f"; no rlfleet key for {', '.join(unmapped[:3])}{' and more' if len(unmapped) > 3 else ''}"
                if unmapped else "")
        return (f"unknown config key {key!r}: verl's keys; in rlfleet {named}{more}{rest} (the whole table: "
                f"{GUIDE})")
    if key.split(".")[0] in VERL_SECTIONS:
        return f"unknown config key {key!r}: a verl section; rlfleet's names for verl's keys are in {GUIDE}"
    section, _, name = key.rpartition(".")
    names = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == section]
    close = [f"{section}.{n}" if section else n
             for n in difflib.get_close_matches(name, names, n=1, cutoff=0.7)]
    if not close:  # the right name in another section (rollout.lr for learner.lr)
        close = [k for k in known if k.rpartition(".")[2] == name][:1]
    return f"unknown config key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
