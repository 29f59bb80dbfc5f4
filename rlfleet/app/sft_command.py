"""`rlfleet sft`: the supervised warm start (verl's SFT trainer, TRL's SFTTrainer) on the learner's path.

    rlfleet sft --data train.parquet --output outputs/sft [--val-data test.parquet --eval-every 50]
                [--config job.yaml] [learner.lr=2e-5 learner.lora.rank=16 ...]

The loss is the cross-entropy of the response tokens only, the prompt rendered with the chat template
as the rollout renders it. Settings that a run also has come from the job config and its dotted
overrides: `model.path|dtype`, `learner.*` (lr and its schedule, warmup, grad_clip, micro_batch_tokens,
pack_sequences, logprob_chunk_tokens, gradient_checkpointing, lora, world_size, device), `run.seed`,
and for the evaluation `data.val_files|prompt_key|max_prompt_length`, `rollout.max_new_tokens|...`
and `reward.*`. With `learner.world_size > 1` the command starts itself again under torchrun, one
process per rank, and trains with FSDP2.

Outputs in `--output`: `metrics.jsonl` (one line per step: `sft/loss`, `actor/lr`, `actor/grad_norm`,
`perf/tokens_per_s`, `val/...`), `checkpoints/step_N/` (resume with `--resume latest`), `eval/step_N.json`
(+ samples), and `model/`, the trained policy as a plain HF folder for `model.path` or `rlfleet eval`.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import subprocess
import sys
import threading
from pathlib import Path

from rlfleet.app.interrupt import StopOnSignal
from rlfleet.checkpoint_files import META
from rlfleet.errors import CheckpointError, ConfigError, DataError, RlfleetError

RESPONSE_KEY = "extra_info.answer"  # where `rlfleet data gsm8k|arithmetic` keep the worked answer


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="supervised fine-tuning (warm start) on prompt/response pairs; writes an "
                                   "HF folder that `rlfleet run` and `rlfleet eval` take")
    p.add_argument("--data", "-d", action="append", required=True,
                   help="Parquet (verl's schema) or JSONL with a prompt and a response; repeat for several")
    p.add_argument("--output", "-o", required=True, help="folder for metrics, checkpoints, evals and model/")
    p.add_argument("--prompt-key", default=None, help="prompt column (default: data.prompt_key, 'prompt')")
    p.add_argument("--response-key", default=RESPONSE_KEY,
                   help=f"response column, dots for nested fields (default: {RESPONSE_KEY})")
    p.add_argument("--model", "-m", help="model folder to start from (default: model.path of the config)")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the data (default 1)")
    p.add_argument("--max-steps", type=int, default=0, help="optimizer steps; overrides --epochs when > 0")
    p.add_argument("--batch-size", type=int, default=32, help="examples per optimizer step (default 32)")
    p.add_argument("--max-length", type=int, default=None,
                   help="examples longer than this many tokens (prompt + response) are left out and "
                        "counted (default: the model's context)")
    p.add_argument("--val-data", action="append", default=None,
                   help="Parquet prompts in verl's schema to evaluate on, greedy, with the job's reward "
                        "(default: data.val_files)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate before training and every N steps (0: only after the last step)")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: after the last)")
    p.add_argument("--resume", default=None,
                   help="latest (the newest intact checkpoint), auto (latest or fresh) or a step_N folder")
    p.add_argument("--config", "-c", help="job YAML file for model, learner, rollout, reward settings")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def _check_options(args: argparse.Namespace) -> None:
    for name in ("batch_size",):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    for name in ("max_steps", "eval_every", "save_every"):
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, not {getattr(args, name)}")
    if args.epochs <= 0 and args.max_steps == 0:
        raise ConfigError(f"--epochs must be > 0 (or give --max-steps), not {args.epochs}")
    if args.max_length is not None and args.max_length < 2:
        raise ConfigError(f"--max-length must be at least 2, not {args.max_length}")


def _under_torchrun(world_size: int, argv: list[str]) -> int:
    """Runs this same command (`argv`, without the program) again under torchrun, one process per
    learner rank; its exit code."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size),
           "-m", "rlfleet.app.cli", *argv]
    print(f"rlfleet: sft with learner.world_size={world_size}: starting {world_size} ranks under torchrun",
          flush=True)
    return subprocess.call(cmd)


def _output_ready(output: Path, resume: str | None) -> None:
    held = [n for n in ("metrics.jsonl", "checkpoints") if (output / n).exists()]
    if held and not resume:
        raise ConfigError(f"--output {output} already holds an SFT run ({', '.join(held)}): pass --resume "
                          "latest to continue it, or choose another folder")
    checkpoints = output / "checkpoints"
    if resume == "latest" and not any(checkpoints.glob(f"step_*/{META}")):
        raise CheckpointError(f"no checkpoint under {checkpoints} to resume from (an sft stopped before it "
                              "saved a step?): --resume auto starts it again from the beginning")
    output.mkdir(parents=True, exist_ok=True)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """`argv`: the command line (without the program), to start the ranks with under torchrun."""
    from rlfleet.config import load_config

    _check_options(args)
    cfg = load_config(args.config, args.overrides)
    world_size = cfg.learner.world_size
    if world_size == 1:
        return _train(args, cfg, None)
    # torch only now (services.learner.distributed imports it): _train checks its inputs first
    from services.learner.distributed import exit_learner_world, init_learner_world, torchrun_env

    if torchrun_env() is None:
        return _under_torchrun(world_size, argv)

    world = init_learner_world(world_size, cfg.learner.device, 0, timeout_s=1800.0)
    try:
        code = _train(args, cfg, world)
    except BaseException as exc:  # noqa: BLE001 - a rank that fails says why and leaves; torchrun stops the rest
        import os
        import traceback

        if isinstance(exc, RlfleetError):
            print(f"rlfleet: error (sft rank {world.rank}): {exc}", file=sys.stderr, flush=True)
        else:
            traceback.print_exc()
        os._exit(2 if isinstance(exc, RlfleetError) else 1)
    exit_learner_world(code)


def _val_files(args: argparse.Namespace, cfg) -> list[Path]:
    """The evaluation files, each checked to exist before any training (not at the first evaluation)."""
    val_files = [Path(f) for f in (args.val_data or cfg.data.val_files)]
    for f in val_files:
        if not f.is_file():
            where = "--val-data" if args.val_data else "data.val_files"
            raise DataError(f"validation file {f} ({where}) does not exist")
    return val_files


def _plan(args: argparse.Namespace, cfg, rank0: bool, val_files: list[Path]):
    from transformers import AutoTokenizer, GenerationConfig

    from rlfleet.app.eval_command import resolve_eval_model
    from rlfleet.data.sft import load_examples
    from rlfleet.models.context import model_context
    from rlfleet.app.sft_trainer import SftPlan

    model_path = resolve_eval_model(args.model or cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS
        eos = None
    eos_ids = [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]
    context = model_context(model_path)
    max_length = args.max_length or (context[0] if context else 2048)
    prompt_key = args.prompt_key or cfg.data.prompt_key
    examples, too_long = load_examples([Path(f) for f in args.data], tokenizer, prompt_key,
                                       args.response_key, max_length, eos_ids)
    max_steps = args.max_steps or math.ceil(args.epochs * len(examples) / args.batch_size)
    if rank0:
        print(f"rlfleet: sft on {len(examples)} examples from {', '.join(Path(f).name for f in args.data)}"
              f"{f' ({too_long} longer than {max_length} tokens left out)' if too_long else ''}: "
              f"{max_steps} steps of {args.batch_size}{_cpu_threads(cfg.learner.device)}", flush=True)
    return SftPlan(output=Path(args.output), model_path=model_path, examples=examples,
                   batch_size=args.batch_size, max_steps=max_steps, eval_every=args.eval_every,
                   save_every=args.save_every, val_files=val_files, prompt_key=prompt_key,
                   max_length=max_length)


def _cpu_threads(device: str) -> str:
    """The start line's note of the torch threads, on the CPU (rlfleet/cpu_threads.py picks them)."""
    import torch

    from rlfleet.devices import runs_on_cpu

    if not runs_on_cpu(device):
        return ""
    threads = torch.get_num_threads()
    return f" on {threads} CPU thread{'s' if threads > 1 else ''} (OMP_NUM_THREADS=N sets them)"


def _train(args: argparse.Namespace, cfg, world) -> int:
    rank0 = world is None or world.rank == 0
    output = Path(args.output)
    val_files = _val_files(args, cfg)
    if rank0:
        _output_ready(output, args.resume)
    # the trainer (torch, transformers) only after the checks above: bad input is refused in a second
    from rlfleet.app.sft_trainer import SftTrainer

    plan = _plan(args, cfg, rank0, val_files)
    # Ctrl-C (or SIGTERM) ends the step under way and checkpoints it, as `rlfleet run` does; a second one
    # stops at once. Under torchrun the ranks keep Python's default: one rank stopping alone would leave
    # the others waiting in a collective.
    stop = threading.Event()
    with StopOnSignal(stop) if world is None else contextlib.nullcontext():
        trainer = SftTrainer(cfg, plan, world)
        try:
            start = trainer.resume(args.resume)
            if start >= plan.max_steps:
                if rank0:
                    print(f"rlfleet: sft already at step {start} of {plan.max_steps}; nothing to train",
                          flush=True)
            elif not trainer.train(start, stop):
                return 130  # leaving the block raises Interrupted, which names the signal
            final = trainer.save_model()
        finally:
            trainer.close()
    if rank0:
        print(f"rlfleet: sft model written to {final} (model.path={final}, or rlfleet eval --model {final})",
              flush=True)
    return 0
