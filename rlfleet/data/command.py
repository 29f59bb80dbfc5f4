"""`rlfleet data gsm8k|jsonl|digits-reverse|arithmetic|reasoning-gym|traces`: Parquet files in the verl
schema (traces: conversations with tool calls, played by rlfleet/app/traces_command.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlfleet.errors import ConfigError, DataError


def add_parser(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="prepare Parquet datasets in the verl schema")
    kinds = data.add_subparsers(dest="kind", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--input", "-i", required=True, help="JSONL file, one record per line")
        p.add_argument("--output", "-o", required=True, help="Parquet file to write")
        p.add_argument("--split", default="train", help="stored in extra_info.split (default: train)")
        p.add_argument(
            "--model",
            help="model folder (or builtin:tiny) whose tokenizer and chat template "
            "measure prompt lengths; without it lengths are checked at training time only",
        )
        p.add_argument(
            "--max-prompt-length",
            type=int,
            default=512,
            help="with --model: prompts longer than this many tokens are left out and counted",
        )

    gsm8k = kinds.add_parser("gsm8k", help="GSM8K JSONL ({question, answer with '#### N'})")
    common(gsm8k)
    gsm8k.add_argument(
        "--instruction",
        default=None,
        help="text appended to each question (default: verl's 'think step by step' line; '' for none)",
    )
    jsonl = kinds.add_parser("jsonl", help="any JSONL: name the prompt and answer fields")
    common(jsonl)
    jsonl.add_argument("--prompt-key", required=True, help="field holding the prompt (text or chat messages)")
    jsonl.add_argument("--answer-key", required=True, help="field holding the ground truth")
    jsonl.add_argument(
        "--data-source",
        default=None,
        help="data_source of every row; picks the reward function (default: the input's name)",
    )
    jsonl.add_argument("--ability", default="general")
    jsonl.add_argument("--instruction", default="", help="text appended to each prompt")
    digits = kinds.add_parser("digits-reverse", help="the built-in task of the embedded default job")
    digits.add_argument("--output", "-o", required=True)
    digits.add_argument("--size", type=int, default=256)
    digits.add_argument("--split", default="test")
    digits.add_argument("--seed", type=int, default=0)
    arithmetic = kinds.add_parser(
        "arithmetic",
        help="generated sums, differences and products in GSM8K's answer format (a real-model task)",
    )
    arithmetic.add_argument("--output", "-o", required=True)
    arithmetic.add_argument("--rows", type=int, default=1000, help="problems to write (default 1000)")
    arithmetic.add_argument("--seed", type=int, default=0)
    arithmetic.add_argument(
        "--split", default="train", help="train or test: the two never share a problem (default train)"
    )
    arithmetic.add_argument(
        "--level", default="easy", choices=("easy", "hard"),
        help="easy: the options below (default); hard: 3-4 numbers of 3-4 digits, products and sums, "
             "a task a calculator decides (the operand options do not apply)",
    )
    arithmetic.add_argument(
        "--operations", default="add,sub,mul", help="comma-separated subset of add,sub,mul (default all)"
    )
    arithmetic.add_argument("--min-operands", type=int, default=2, help="2 or 3 (default 2)")
    arithmetic.add_argument("--max-operands", type=int, default=3, help="2 or 3 (default 3)")
    arithmetic.add_argument("--min-value", type=int, default=1, help="smallest operand (default 1)")
    arithmetic.add_argument("--max-value", type=int, default=99, help="largest operand of sums and "
                            "differences (default 99)")
    arithmetic.add_argument("--mul-max-value", type=int, default=20, help="largest operand of products "
                            "(default 20)")
    arithmetic.add_argument(
        "--instruction", default=None,
        help="text appended to each question (default: the GSM8K converter's '####' line; '' for none)",
    )
    rg = kinds.add_parser(
        "reasoning-gym",
        help="reasoning-gym tasks from their generators, scored by their own verifiers (needs rlfleet[envs])",
    )
    rg.add_argument("tasks", metavar="TASK[,TASK...]",
                    help="reasoning-gym task names, e.g. chain_sum,leg_counting")
    rg.add_argument("--rows", type=int, default=1000,
                    help="rows to write, shared out among the tasks (default 1000)")
    rg.add_argument("--output", "-o", required=True, help="Parquet file to write")
    rg.add_argument("--seed", type=int, default=0)
    rg.add_argument("--split", default="train",
                    help="train or test: the two never share a question (default train)")
    rg.add_argument("--instruction", default=None,
                    help="text appended to each question (default: answer between <answer> tags; '' none)")
    traces = kinds.add_parser(
        "traces",
        help="tool-use traces for a warm start (rlfleet sft): a task worked with an environment's tool, "
             "every result from the environment server",
    )
    _traces_arguments(traces)


def _reasoning_gym(args: argparse.Namespace) -> int:
    try:
        from rlfleet.data import reasoning_gym
        import reasoning_gym as _package  # noqa: F401 - the optional dependency, named when missing
    except ImportError:
        raise ConfigError("rlfleet data reasoning-gym needs the reasoning-gym package: "
                          "pip install 'rlfleet[envs]'") from None
    from rlfleet.data import convert

    tasks = reasoning_gym.parse_tasks(args.tasks)
    instruction = reasoning_gym.INSTRUCTION if args.instruction is None else args.instruction
    rows = reasoning_gym.make_rows(tasks, args.rows, args.seed, args.split, instruction)
    path = convert.write_rows(rows, args.output)
    print(f"rlfleet: wrote {len(rows)} {args.split} rows ({', '.join(tasks)}) to {path}")
    return 0



def _traces_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--env", help="environment to serve here for the command: a built-in (calculator) "
                                     "or pkg.module:Class")
    where.add_argument("--env-address", help="HOST:PORT of a running environment server")
    p.add_argument("--task", default="arithmetic", choices=("arithmetic",),
                   help="the task whose rows are worked")
    p.add_argument("--level", default="easy", choices=("easy", "hard"),
                   help="arithmetic level (default easy)")
    p.add_argument("--rows", type=int, default=2000, help="task rows to work (default 2000); the wrong "
                   "ones are dropped, so the file may hold fewer")
    p.add_argument("--seed", type=int, default=0, help="seed of the rows drawn (default 0)")
    p.add_argument("--output", "-o", required=True, help="Parquet file to write")
    p.add_argument("--instruction", default=None,
                   help="text appended to each question (default: the task's '####' line; '' for none)")
    p.add_argument("--tools-in-prompt", default="auto", choices=("auto", "false"),
                   help="auto: the tools go in the `tools` column, so that SFT puts them into the prompt "
                        "as the rollout does (env.tools_in_prompt=auto); false: left out, for a job with "
                        "env.tools_in_prompt=false")
    p.add_argument("--timeout-s", type=float, default=30.0, help="deadline of each environment call")


def _length_filter(rows: list[dict], args: argparse.Namespace) -> tuple[list[dict], str]:
    if args.model is None:
        return rows, "prompt lengths not checked (pass --model to filter them now; training filters them too)"
    if args.max_prompt_length < 1:
        raise ConfigError(f"--max-prompt-length must be at least 1, not {args.max_prompt_length}")
    from transformers import AutoTokenizer

    from rlfleet.data.convert import filter_by_length
    from rlfleet.models.resolve import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
    kept, dropped = filter_by_length(rows, tokenizer, args.max_prompt_length)
    if not kept:
        raise DataError(
            f"all {len(rows)} prompts of {args.input} are longer than --max-prompt-length="
            f"{args.max_prompt_length} tokens; nothing written"
        )
    return kept, f"{dropped} of {len(rows)} prompts longer than {args.max_prompt_length} tokens left out"


def _arithmetic(args: argparse.Namespace) -> int:
    from rlfleet.data import arithmetic, convert

    spec = arithmetic.ArithmeticSpec(
        operations=tuple(op.strip() for op in args.operations.split(",") if op.strip()),
        min_operands=args.min_operands,
        max_operands=args.max_operands,
        min_value=args.min_value,
        max_value=args.max_value,
        mul_max_value=args.mul_max_value,
    )
    instruction = convert.GSM8K_INSTRUCTION if args.instruction is None else args.instruction
    rows = arithmetic.make_rows(args.rows, args.seed, args.split, spec, instruction, args.level)
    path = convert.write_rows(rows, args.output)
    print(f"rlfleet: wrote {len(rows)} {args.split} rows ({arithmetic.TASK_NAME}, {args.level}) to {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    from rlfleet.data import convert

    if args.kind == "digits-reverse":
        from rlfleet.data.tasks import write_parquet

        if args.size < 1:
            raise ConfigError(f"--size must be at least 1, not {args.size}")
        path = write_parquet(args.output, args.size, args.seed, args.split)
        print(f"rlfleet: wrote {args.size} rows to {path}")
        return 0
    if args.kind == "arithmetic":
        return _arithmetic(args)
    if args.kind == "reasoning-gym":
        return _reasoning_gym(args)
    records = convert.read_jsonl(args.input)
    if args.kind == "gsm8k":
        instruction = convert.GSM8K_INSTRUCTION if args.instruction is None else args.instruction
        rows = convert.gsm8k_rows(records, args.input, args.split, instruction)
    else:
        rows = convert.jsonl_rows(
            records,
            args.input,
            args.prompt_key,
            args.answer_key,
            args.data_source or Path(args.input).stem,
            args.ability,
            args.split,
            args.instruction,
        )
    rows, note = _length_filter(rows, args)
    path = convert.write_rows(rows, args.output)
    print(f"rlfleet: wrote {len(rows)} rows to {path}; {note}")
    return 0
