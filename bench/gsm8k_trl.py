"""A recipe's job through TRL's GRPOTrainer, for a side-by-side with rlfleet
(docs/recipes/gsm8k-smollm2.md, docs/recipes/arithmetic-smollm2.md): same model folder, same Parquet
prompts (chat messages), the same reward rule as rlfleet would pick (the config's `reward.fn`, `auto`
by data_source, scored by rlfleet's own reward core and told whether each completion was cut at the
token budget), same group size, prompts per step, temperature, response budget, learning rate and
warmup, clip (0.2 / 0.28), no KL, token-mean loss; transformers `generate` (TRL's default without
vLLM), one GPU; `--fast`: TRL's fastest generation without vLLM (transformers' continuous batching) and
larger micro-batches. Stops after --max-steps or --wall-s seconds, whichever comes first, then saves the
model for `rlfleet eval`. --save-steps 20,40,60 also saves the model as it is after those steps (and
after the last step, should the run stop before them) in OUT/step_N/, each written under a
temporary name and renamed when complete, so a watcher may evaluate it while training goes on.

    python bench/gsm8k_trl.py --config deploy/configs/arithmetic-smollm2-135m.yaml --out OUT_DIR
    python bench/gsm8k_trl.py --model MODEL_DIR --data train.parquet --out OUT_DIR [--wall-s 300]

--model and --data default to the config's model.path and first data.train_files.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_reward(fn: str, eos_ids: set[int], rewards: list[float]):
    """A TRL reward function scoring with rlfleet's reward core for `reward.fn=fn`, each completion told
    whether it was cut at the budget; scored values are appended to `rewards`."""
    from rlfleet.types import ScoreItem
    from services.reward.scorer import RewardScorer

    scorer = RewardScorer(fn)  # the rule rlfleet's reward service would use for this job

    def finish_reason(ids: list[int]) -> str:
        # TRL hands over each completion up to and including its first EOS; one that does not end on an
        # EOS ran out of max_completion_length (rlfleet's rollout says "length" for the same).
        return "stop" if ids and ids[-1] in eos_ids else "length"

    def rlfleet_reward(prompts, completions, ground_truth, data_source, extra_info_json, completion_ids,
                       **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        items = [ScoreItem(str(i), src, "", text, truth, json.loads(extra), finish_reason(list(ids)))
                 for i, (src, text, truth, extra, ids)
                 in enumerate(zip(data_source, texts, ground_truth, extra_info_json, completion_ids))]
        scores = [r.score if r.ok else None for r in scorer.score(items)]  # None: TRL leaves it out
        rewards.extend(s for s in scores if s is not None)
        return scores

    return rlfleet_reward


def save_steps(text: str) -> tuple[int, ...]:
    """--save-steps: "20,40,60" -> (20, 40, 60); one clear error for anything else."""
    try:
        steps = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--save-steps wants comma-separated step numbers, not {text!r}")
    if not steps or steps[0] < 1:
        raise argparse.ArgumentTypeError(f"--save-steps wants step numbers >= 1, not {text!r}")
    return steps


def save_model(model, tokenizer, folder: Path) -> None:
    """The model as it is now, for `rlfleet eval`: written beside `folder` and renamed into place, so a
    folder that exists is complete. The weights keep their training dtype (bf16 on GPU, which is what
    `rlfleet eval` loads there anyway)."""
    import shutil

    staging = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="default: model.path of the config")
    p.add_argument("--data", help="default: the first of data.train_files of the config")
    p.add_argument("--out", required=True)
    p.add_argument("--config", default="deploy/configs/gsm8k-smollm2-135m.yaml")
    p.add_argument("--max-steps", type=int, default=0, help="default: the config's controller.max_steps")
    p.add_argument("--wall-s", type=float, default=0.0,
                   help="stop after this many seconds of training (0: none)")
    p.add_argument("--micro-batch", type=int, default=64, help="sequences per forward/backward")
    p.add_argument("--fast", action="store_true",
                   help="TRL at its fastest on one GPU without vLLM: transformers' continuous batching for "
                        "generation (use_transformers_continuous_batching), 128 sequences per "
                        "forward/backward")
    p.add_argument("--save-steps", type=save_steps, default=(),
                   help="comma-separated steps after which the model is saved to OUT/step_N/ (e.g. 20,40,60)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, as rlfleet's")
    args = p.parse_args()

    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlfleet.config import load_config
    from services.reward.registry import rule_label

    cfg = load_config(args.config, args.overrides)
    args.model = args.model or cfg.model.path
    args.data = args.data or (cfg.data.train_files[0] if cfg.data.train_files else None)
    if not args.data:
        p.error("--data is needed: the config has no data.train_files")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = pq.read_table(args.data).to_pylist()
    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"],
                                  "data_source": r["data_source"],
                                  "extra_info_json": json.dumps(r.get("extra_info") or {})} for r in rows])
    rewards: list[float] = []
    print(json.dumps({"rules": {src: rule_label(cfg.reward.fn, src)
                                for src in sorted({r["data_source"] for r in rows})}}), flush=True)
    eos_ids: set[int] = set()  # filled once the trainer has read the model's generation config
    rlfleet_reward = make_reward(cfg.reward.fn, eos_ids, rewards)

    start = time.time()
    saved: set[int] = set()

    class Progress(TrainerCallback):
        seen = 0

        def on_step_end(self, targs, state, control, **kwargs):
            batch = rewards[self.seen:]
            self.seen = len(rewards)
            line = {"step": state.global_step, "t": round(time.time() - start, 2),
                    "reward": sum(batch) / max(1, len(batch)), "samples": len(batch)}
            print(json.dumps(line), flush=True)
            with open(out / "trl_steps.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
            if state.global_step in args.save_steps:
                save_model(kwargs["model"], tokenizer, out / f"step_{state.global_step}")
                saved.add(state.global_step)
            if args.wall_s and time.time() - start > args.wall_s:
                control.should_training_stop = True

    cuda = torch.cuda.is_available()
    group = cfg.controller.prompts_per_step * cfg.rollout.n
    micro = min(128 if args.fast else args.micro_batch, group)
    lc, alg = cfg.learner, cfg.algorithm
    config = GRPOConfig(
        output_dir=str(out / "trainer"), max_steps=args.max_steps or cfg.controller.max_steps,
        seed=cfg.run.seed,
        per_device_train_batch_size=micro, gradient_accumulation_steps=group // micro,
        num_generations=cfg.rollout.n, max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, use_vllm=False,
        learning_rate=lc.lr, lr_scheduler_type="constant_with_warmup", warmup_steps=lc.lr_warmup_steps,
        adam_beta1=lc.betas[0], adam_beta2=lc.betas[1], weight_decay=lc.weight_decay,
        max_grad_norm=lc.grad_clip,
        optim="adamw_torch_fused" if cuda else "adamw_torch", beta=alg.kl_coef, epsilon=alg.clip_low,
        epsilon_high=alg.clip_high,
        num_iterations=1, loss_type="dapo", scale_rewards="group", bf16=cuda, use_cpu=not cuda,
        gradient_checkpointing=False, model_init_kwargs={"dtype": torch.bfloat16 if cuda else torch.float32},
        logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
        use_transformers_continuous_batching=args.fast,
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = GRPOTrainer(model=args.model, reward_funcs=rlfleet_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Progress()])
    eos_ids.update(trainer.eos_token_ids)  # what TRL itself stops generation on
    trainer.train()
    last = trainer.state.global_step
    if args.save_steps and last not in saved:  # stopped early (--wall-s): the last step is kept too
        save_model(trainer.model, tokenizer, out / f"step_{last}")
    trainer.model.to(torch.float32).save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    print(json.dumps({"steps": trainer.state.global_step, "seconds": round(time.time() - start, 1),
                      "samples": len(rewards), "reward_mean": sum(rewards) / max(1, len(rewards))}),
                      flush=True)


if __name__ == "__main__":
    main()
