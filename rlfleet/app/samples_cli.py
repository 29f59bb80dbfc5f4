"""`rlfleet samples RUN_DIR`: a run's episodes from samples/, readable.

Each sample: its step, prompt, response, reward, ground truth, the policy version that generated it and
its staleness (the version trained minus it); a multi-turn episode turn by turn, with each turn's tool
calls, the environment's answer and which spans are masked out of the loss. Filters: `--step`,
`--reward`, `--failed`, `--tool-errors`, `--last N`; `--val` reads the validation samples; `--json`
prints the chosen records as stored, one a line.
"""

from __future__ import annotations

import argparse
import json
import operator
import re
import sys
from pathlib import Path
from typing import Any

from rlfleet.env.toolcalls import parse_tool_calls
from rlfleet.errors import DataError

DEFAULT_LAST = 10
PROMPT_TAIL_CHARS = 400  # a prompt longer than this shows its end (the question) unless --full

_COMPARISON = re.compile(r"\s*(<=|>=|==|!=|<|>|=)?\s*(-?\d+(?:\.\d*)?|-?\.\d+)\s*")
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "=": operator.eq,
        "==": operator.eq, "!=": operator.ne, None: operator.eq}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("samples", help="print a run's samples readably: prompt, response, reward, version, "
                       "staleness, each turn of an episode with its tool calls and masked spans")
    p.add_argument("run_dir", help="the run folder (<output_dir>/<name>) holding samples/")
    p.add_argument("--val", action="store_true",
                   help="the validation samples (samples/val.jsonl), not training")
    p.add_argument("--step", type=int, action="append", help="only this step (repeat for several)")
    p.add_argument("--reward", help="only rewards matching: a value (1) or a comparison ('<0.5', '>=1')")
    p.add_argument("--failed", action="store_true",
                   help="only samples without a reward: the reward or the environment failed")
    p.add_argument("--tool-errors", action="store_true", help="only episodes with a tool call that failed")
    p.add_argument("--last", type=int, default=DEFAULT_LAST,
                   help=f"the last N chosen samples (default {DEFAULT_LAST}; 0: all)")
    p.add_argument("--full", action="store_true", help="whole prompts (default: the end of a long one)")
    p.add_argument("--json", action="store_true", help="the chosen records as stored, one JSON object a line")


def reward_filter(spec: str):
    """'1', '=1', '<0.5', '>=1', '!=0' -> a predicate on a reward (None never matches)."""
    match = _COMPARISON.fullmatch(spec)
    if match is None:
        raise DataError(f"--reward {spec!r}: give a number or a comparison such as '<0.5', '>=1', '!=0'")
    op, value = _OPS[match.group(1)], float(match.group(2))
    return lambda reward: reward is not None and op(float(reward), value)


def read_samples(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        run = path.parent.parent
        hint = (f"is {run} a run folder?" if not (run / "metrics.jsonl").is_file()
                else "the run has written none yet" + ("" if path.name == "val.jsonl" else
                                                       " (controller.samples_per_step=0 writes none)"))
        raise DataError(f"{path} does not exist: {hint}")
    records = []
    lines = path.read_text().splitlines()
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if line_no == len(lines):  # the line a running controller is still writing
                break
            raise DataError(f"{path} line {line_no} is not valid JSON: {exc.msg}") from None
        if not isinstance(record, dict):
            raise DataError(f"{path} line {line_no} is not a JSON object")
        records.append(record)
    return records


def failed(record: dict[str, Any]) -> bool:
    return record.get("reward") is None or bool(record.get("env_failure") or record.get("error")
                                                   or record.get("reward_error"))


def tool_errors(record: dict[str, Any]) -> int:
    if "turns" in record and isinstance(record["turns"], list):
        return sum(t.get("tool_errors", 0) for t in record["turns"])
    return int(record.get("tool_errors", 0) or 0)


def select(records: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    chosen = records
    if args.step:
        chosen = [r for r in chosen if r.get("step") in args.step]
    if args.reward is not None:
        matches = reward_filter(args.reward)
        chosen = [r for r in chosen if matches(r.get("reward"))]
    if args.failed:
        chosen = [r for r in chosen if failed(r)]
    if args.tool_errors:
        chosen = [r for r in chosen if tool_errors(r)]
    if args.last < 0:
        raise DataError(f"--last must be 0 (all) or more, not {args.last}")
    return chosen[-args.last:] if args.last else chosen


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in (text.splitlines() or [""]))


def _value(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def _calls(text: str) -> list[str]:
    out = []
    for call in parse_tool_calls(text):
        arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        out.append(f"{call.name or '(unreadable)'}({arguments})")
    return out


def _header(r: dict[str, Any]) -> str:
    parts = [f"step {r.get('step', '?')}", f"prompt {r.get('prompt_index', '?')}"]
    if "evaluated_version" in r:  # a validation sample
        parts += [f"{r.get('data_source', '')} sample {r.get('sample', 0)}".strip(),
                  f"version {r.get('policy_version', r['evaluated_version'])}"]
    else:
        version, trained = r.get("version"), r.get("trained_version")
        parts.append(f"version {version}")
        if trained is not None and version is not None:
            parts.append(f"trained at {trained} (staleness {trained - version})")
        elif r.get("dropped"):
            parts.append(f"not trained: {r['dropped']}")
    parts += [f"reward {_value(r.get('reward'))}", f"finish {r.get('finish_reason', '?')}"]
    return "── " + " · ".join(parts) + " ──"


def _turns(r: dict[str, Any]) -> list[str]:
    lines = []
    if r.get("prompt_trim"):
        lines.append(f"  ({r['prompt_trim']} prompt tokens dropped from the episode's context)")
    for t in r["turns"]:
        version = t.get("version")
        lines.append(f"  turn {t.get('turn')} · version {version} · {t.get('generated_tokens', '?')} model "
                     f"tokens (in the loss) · finish {t.get('finish_reason', '?')}:")
        lines.append(_indent(t.get("text", "")))
        calls = _calls(t.get("text", ""))
        if calls or t.get("tool_calls"):
            errors = t.get("tool_errors", 0)
            lines.append(f"    tool calls: {', '.join(calls) or t.get('tool_calls')}"
                         + (f"  [{errors} failed]" if errors else ""))
        if t.get("observation") or t.get("observed_tokens"):
            lines.append(f"  environment · {t.get('observed_tokens', '?')} tokens (masked out of the loss)"
                         + (f" · reward {_value(t['reward'])}" if t.get("reward") is not None else "") + ":")
            lines.append(_indent(t.get("observation", "")))
    return lines


def format_record(r: dict[str, Any], full: bool = False) -> str:
    prompt = str(r.get("prompt", ""))
    if not full and len(prompt) > PROMPT_TAIL_CHARS:
        prompt = f"…({len(prompt) - PROMPT_TAIL_CHARS} chars before) " + prompt[-PROMPT_TAIL_CHARS:]
    lines = [_header(r), "  prompt:", _indent(prompt)]
    if isinstance(r.get("turns"), list) and r["turns"]:
        lines += _turns(r)
        if r.get("env_reward") is not None:
            lines.append(f"  environment reward: {_value(r['env_reward'])}")
    else:
        lines += ["  response:", _indent(str(r.get("response", "")))]
        if isinstance(r.get("turns"), int) and r["turns"]:  # a validation episode: its counts only
            lines.append(f"  episode: {r['turns']} turns, {r.get('tool_calls', 0)} tool calls "
                         f"({r.get('tool_errors', 0)} failed)")
    lines.append(f"  ground truth: {r.get('ground_truth', '-')}"
                 + (f" · answer read: {r['answer']}" if r.get("answer") is not None else ""))
    for key, label in (("env_failure", "environment failed"), ("env_error", "environment error"),
                       ("reward_error", "reward failed"), ("error", "reward failed")):
        if r.get(key):
            lines.append(f"  {label}: {r[key]}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    path = run_dir / "samples" / ("val.jsonl" if args.val else "train.jsonl")
    records = read_samples(path)
    chosen = select(records, args)
    if args.json:
        sys.stdout.writelines(json.dumps(r) + "\n" for r in chosen)
        return 0
    for r in chosen:
        print(format_record(r, args.full) + "\n")
    matching = len(select(records, argparse.Namespace(**{**vars(args), "last": 0})))
    print(f"rlfleet: {len(chosen)} of {matching} matching samples shown ({len(records)} in {path})"
          + ("; --last 0 shows them all" if len(chosen) < matching else ""))
    return 0
