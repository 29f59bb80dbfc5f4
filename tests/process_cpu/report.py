"""Where the suite's CPU went (`make test-cpu`): CPU seconds per kind of process (an `rlfleet` subcommand, a
service role, a Python one-liner), per test, and the share spent in processes that imported torch, from
the log that sitecustomize.py writes.

python -m tests.process_cpu.report --run LOG -- COMMAND...  runs COMMAND (the suite) with every Python
    process it starts logging to LOG, then reports, against the CPU of all the processes it waited for
python -m tests.process_cpu.report LOG                      reports on a LOG written before"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

RLFLEET_GROUPS = {"env", "reward", "data", "model", "fleet"}  # subcommands that take a sub-subcommand


def process_kind(argv: list[str], in_pytest: bool = False) -> str:
    """`rlfleet serve learner`, `rlfleet data arithmetic`, `rlfleet eval`, `python -c`, `pytest` (the suite's
    own processes: in-process tests run there), or the script's name."""
    if in_pytest:
        return "pytest"
    if not argv:
        return "python"
    head = argv[0]
    if head == "-c":
        return "python -c"
    if Path(head).name in ("rlfleet", "cli.py"):
        words = [a for a in argv[1:] if not a.startswith("-")]
        if words and (words[0] == "serve" or words[0] in RLFLEET_GROUPS):
            return "rlfleet " + " ".join(words[:2])
        return "rlfleet " + (words[0] if words else "")
    return Path(head).name


def summarize(lines: list[dict]) -> dict:
    """Totals per kind and per test: {kind: [processes, cpu_s, with torch]}, {test: [processes, cpu_s]}."""
    kinds: dict[str, list] = defaultdict(lambda: [0, 0.0, 0])
    tests: dict[str, list] = defaultdict(lambda: [0, 0.0])
    torch_cpu = 0.0
    for line in lines:
        kind = kinds[process_kind(line["argv"], line.get("pytest", False))]
        kind[0] += 1
        kind[1] += line["cpu_s"]
        kind[2] += bool(line["torch"])
        torch_cpu += line["cpu_s"] if line["torch"] else 0.0
        if line["test"]:
            tests[line["test"]][0] += 1
            tests[line["test"]][1] += line["cpu_s"]
    return {"processes": len(lines), "cpu_s": sum(k[1] for k in kinds.values()),
            "torch_processes": sum(k[2] for k in kinds.values()), "torch_cpu_s": torch_cpu,
            "kinds": dict(kinds), "tests": dict(tests)}


def render(summary: dict, suite_cpu_s: float | None = None, top: int = 25) -> str:
    out = [f"processes logged: {summary['processes']}, {summary['cpu_s']:.0f} CPU-s; "
           f"{summary['torch_processes']} imported torch: {summary['torch_cpu_s']:.0f} CPU-s"]
    if suite_cpu_s:
        logged, with_torch = summary["cpu_s"] / suite_cpu_s, summary["torch_cpu_s"] / suite_cpu_s
        out.append(f"the log accounts for {logged:.0%} of the run's {suite_cpu_s:.0f} CPU-s; "
                   f"torch-importing processes for {with_torch:.0%}")
    out.append("\nCPU-s  processes  with torch  kind")
    for kind, (n, cpu, with_torch) in sorted(summary["kinds"].items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"{cpu:6.0f}  {n:9d}  {with_torch:10d}  {kind}")
    out.append("\nCPU-s  processes  test")
    for test, (n, cpu) in sorted(summary["tests"].items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"{cpu:6.0f}  {n:9d}  {test}")
    return "\n".join(out)


def run_logged(log: Path, command: list[str]) -> tuple[int, float]:
    """Runs the command with this folder's sitecustomize.py loaded by every Python process under it;
    returns its exit status and the CPU seconds of all the processes that were waited for."""
    log.unlink(missing_ok=True)
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "RLFLEET_PROCESS_CPU_LOG": str(log.resolve())}
    rc = subprocess.call(command, env=env)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return rc, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("command", nargs="*", help="with --run: the command to run and measure")
    parser.add_argument("--run", action="store_true", help="run COMMAND (after --) and log its processes")
    parser.add_argument("--suite-cpu", type=float, default=None, help="the run's user+sys CPU seconds")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    rc, suite_cpu = 0, args.suite_cpu
    if args.run:
        if not args.command:
            parser.error("--run needs the command to run after --")
        rc, suite_cpu = run_logged(args.log, args.command)
    if not args.log.is_file():
        sys.exit(f"report: no process log at {args.log}")
    lines = [json.loads(text) for text in args.log.read_text().splitlines() if text.strip()]
    print(render(summarize(lines), suite_cpu, args.top), flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
