"""`rlfleet data traces`: tool-use traces for a warm start, every tool result executed by the environment.

    rlfleet data traces --env calculator --task arithmetic [--level hard] [--rows N] --output traces.parquet
    rlfleet data traces --env-address HOST:PORT --task arithmetic ...     # any environment server

The task's training rows are drawn (train side only: the test side stays held out), a scripted teacher
works each one with the environment's tool (rlfleet/data/traces.py), and the environment server itself
answers every call, through the rollout's own client (services/rollout/env_client.py) and call parser.
`--env NAME` serves the environment in this process for the command's length, as `rlfleet eval` does.
A trace whose final answer the task's rule does not credit is dropped and counted, as is one whose
episode the environment failed or did not end. The rows are OpenAI conversations with the tools
offered (the environment's Describe, as the rollout puts them into its prompts): `rlfleet sft` trains
on them with the tokens the agent loop would produce (rlfleet/data/conversation.py).
"""
from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from rlfleet.errors import ConfigError

@contextlib.contextmanager
def _environment(args: argparse.Namespace) -> Iterator[str]:
    from rlfleet.rpc.channel import wait_until_serving

    if args.env_address:
        wait_until_serving(args.env_address, "environment", args.timeout_s).close()
        yield args.env_address
        return
    from rlfleet.app.env_sdk import EnvServer

    server = EnvServer(args.env, "127.0.0.1", 0, None, max_workers=8)
    try:
        yield server.address
    finally:
        server.stop(grace_s=1.0)


def _task_rows(args: argparse.Namespace) -> list[dict]:
    from rlfleet.data import arithmetic, convert

    instruction = convert.GSM8K_INSTRUCTION if args.instruction is None else args.instruction
    return arithmetic.make_rows(args.rows, args.seed, "train", instruction=instruction, level=args.level)


def run(args: argparse.Namespace) -> int:
    if args.rows < 1:
        raise ConfigError(f"--rows must be at least 1, not {args.rows}")
    if args.timeout_s <= 0:
        raise ConfigError(f"--timeout-s must be > 0, not {args.timeout_s}")
    from rlfleet.data.convert import write_rows
    from rlfleet.env.tool_prompt import openai_tools
    from rlfleet.rpc.env_describe import describe_tools
    from services.rollout.env_client import EnvClient
    from rlfleet.app.trace_player import play_traces

    rows = _task_rows(args)
    with _environment(args) as address:
        specs = describe_tools(address, args.timeout_s, args.timeout_s) or ()
        if not specs:
            raise ConfigError(f"the environment at {address} describes no tools: there is no call to trace")
        tools_json = json.dumps(openai_tools(specs)) if args.tools_in_prompt == "auto" else ""
        client = EnvClient(address, args.timeout_s)
        try:
            traces, dropped = play_traces(client, rows, specs[0].name, tools_json)
        finally:
            client.close()
    where = args.env or address
    if not traces:
        raise ConfigError(f"no trace of {len(rows)} was right ({_dropped_text(dropped)}): nothing written; "
                          f"is {where} the calculator the task needs?")
    path = write_rows(traces, Path(args.output))
    calls = sum(t["extra_info"]["tool_calls"] for t in traces)
    print(f"rlfleet: wrote {len(traces)} traces ({args.task}, {args.level}; {calls / len(traces):.2f} tool "
          f"calls each, every result from {where}) to {path}; dropped {sum(dropped.values())} of "
          f"{len(rows)}: {_dropped_text(dropped)}", flush=True)
    return 0


def _dropped_text(dropped: dict[str, int]) -> str:
    return ", ".join(f"{count} {why}" for why, count in dropped.items())
