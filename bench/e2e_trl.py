"""The TRL arm of bench/e2e_grpo.py: trl.GRPOTrainer on one device, transformers `generate` (no vLLM).

Runs as a child process (`python bench/e2e_trl.py PARAMS.json`) so its GPU memory and imports
stay out of the other arms. A reward function equivalent to rlfleet's reward.fn=auto
(the built-in function of each row's data_source, services/reward/registry.py) also counts the
completion tokens TRL hands it; a callback stamps the end of every optimizer step and appends
one JSON line per step to PARAMS["steps_file"].

Matched to the rlfleet arms: same model folder and prompts, num_generations = rollout.n,
prompts per optimizer step, max_completion_length = max_new_tokens, temperature 1 / top_p 1 /
top_k 0, lr (constant), AdamW betas (0.9, 0.99), grad clip 1, beta (KL) 0, clip 0.2, token-mean
loss ("dapo"), one optimizer step per generation batch, bf16 weights on CUDA, no gradient
checkpointing (TRL's default is on; rlfleet's learner has none).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e_common import ArmResult, StepRecord


def run_arm(args, *, model_dir: Path, rows_file: Path, micro_batch_seqs: int, env: dict) -> ArmResult:
    name = "trl"
    steps_file = Path(args.work_dir) / "trl_steps.jsonl"
    steps_file.unlink(missing_ok=True)
    cuda = args.device == "cuda"
    params = {"model_dir": str(model_dir), "rows_file": str(rows_file), "steps_file": str(steps_file),
              "output_dir": str(Path(args.work_dir) / "trl_out"), "cuda": cuda, "seed": args.seed,
              "n": args.n, "prompts_per_step": args.prompts_per_step, "micro_batch_seqs": micro_batch_seqs,
              "max_new_tokens": args.max_new_tokens, "lr": args.lr,
              "max_steps": args.warmup_steps + args.steps,
              "t0": time.time()}
    params_file = Path(args.work_dir) / "trl_params.json"
    params_file.write_text(json.dumps(params))
    child_env = dict(env, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                     HF_DATASETS_CACHE=str(Path(args.work_dir) / "hf_datasets"), WANDB_DISABLED="true")
    if cuda:
        child_env["CUDA_VISIBLE_DEVICES"] = str(args.trl_gpu)
    log_path = Path(args.work_dir) / "trl.log"
    t0 = time.perf_counter()
    error = ""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(params_file)], stdout=log,
                                stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
        try:
            rc = proc.wait(args.arm_timeout_s)
            if rc != 0:
                text = log_path.read_text(errors="replace")
                error = f"exit {rc}: " + " ".join(text[-400:].split())
        except subprocess.TimeoutExpired:
            error = f"timed out after {args.arm_timeout_s:.0f}s"
            proc.kill()
            proc.wait()
    total = time.perf_counter() - t0
    steps = []
    if steps_file.exists():
        for text in steps_file.read_text().splitlines():
            d = json.loads(text)
            steps.append(StepRecord(d["step"], d["t"] - params["t0"], d["samples"], d["tokens"],
                                    {"reward": d["reward"]}))
    accumulation = args.prompts_per_step * args.n // micro_batch_seqs
    note = f"GRPOTrainer, {micro_batch_seqs} seqs x {accumulation} accumulation"
    return ArmResult(name, steps, total, note=note, error=error)


def child(params: dict) -> None:
    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from services.reward.registry import builtin_functions

    by_source = builtin_functions()  # the reward rlfleet's reward.fn=auto picks for each data_source

    cuda = params["cuda"]
    table = pq.read_table(params["rows_file"]).to_pylist()
    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"],
                                  "data_source": r["data_source"]} for r in table])
    seen = {"tokens": 0, "samples": 0, "rewards": []}

    def digits_reward(prompts, completions, completion_ids, ground_truth, data_source, **_):
        seen["tokens"] += sum(len(ids) for ids in completion_ids)
        seen["samples"] += len(completion_ids)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [by_source[src](src, text, truth)
                  for src, text, truth in zip(data_source, texts, ground_truth)]
        seen["rewards"] += scores
        return scores

    class StepStamp(TrainerCallback):
        def __init__(self):
            self.last = {"tokens": 0, "samples": 0, "rewards": 0}

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            rewards = seen["rewards"][self.last["rewards"]:]
            record = {"step": state.global_step, "t": time.time(),
                      "samples": seen["samples"] - self.last["samples"],
                      "tokens": seen["tokens"] - self.last["tokens"],
                      "reward": sum(rewards) / len(rewards) if rewards else 0.0}
            self.last = {"tokens": seen["tokens"], "samples": seen["samples"],
                         "rewards": len(seen["rewards"])}
            with open(params["steps_file"], "a") as f:
                f.write(json.dumps(record) + "\n")

    group = params["prompts_per_step"] * params["n"]
    micro = params["micro_batch_seqs"]
    config = GRPOConfig(
        output_dir=params["output_dir"], max_steps=params["max_steps"], seed=params["seed"],
        per_device_train_batch_size=micro, gradient_accumulation_steps=group // micro,
        num_generations=params["n"], max_completion_length=params["max_new_tokens"],
        temperature=params.get("temperature", 1.0), top_p=1.0, top_k=0, use_vllm=False,
        learning_rate=params["lr"], lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch_fused" if cuda else "adamw_torch",
        beta=0.0, epsilon=0.2, num_iterations=1, loss_type="dapo", scale_rewards="group",
        bf16=cuda, use_cpu=not cuda, gradient_checkpointing=False,
        model_init_kwargs={"dtype": "bfloat16" if cuda else "float32"},
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, log_completions=False,
        shuffle_dataset=False, dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(params["model_dir"])
    trainer = GRPOTrainer(model=params["model_dir"], reward_funcs=digits_reward, args=config,
                          train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepStamp()])
    print(f"trl: device {trainer.accelerator.device}, dtype {next(trainer.model.parameters()).dtype}",
          flush=True)
    trainer.train()


if __name__ == "__main__":
    child(json.loads(Path(sys.argv[1]).read_text()))
