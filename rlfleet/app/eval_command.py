"""`rlfleet eval`: a model folder or checkpoint, in this process, on Parquet prompts.

Generation uses the rollout's HF engine and scoring the reward service's scorer,
both in-process, so the numbers match what training logs as `val/...`.
Options not given on the command line come from the job config (`--config`
and dotted overrides): `model.dtype`, `rollout.device|top_p|top_k|stop|
max_new_tokens|max_batch_sequences`, `data.prompt_key|max_prompt_length`,
`reward.fn`, `run.seed`.

With an environment (`env.name` or `env.address`, docs/environments.md) every sample is an episode
played by the rollout's agent loop, as in training and its validation: `env.address` is connected
to, `env.name` is served in this process for the evaluation's length (on `env.port`, 0: a free
one), both with the job's `security` (TLS, bearer token). The report adds turns and tool calls.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from rlfleet.config import BUILTIN_MODEL
from rlfleet.errors import ConfigError
from rlfleet.eval.scoring import CORRECT_AT


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a model or checkpoint on Parquet prompts: accuracy, pass@k")
    p.add_argument(
        "--model",
        "-m",
        help="HF model folder, checkpoint (checkpoints/step_N), run folder "
        "(its latest checkpoint) or builtin:tiny; default: model.path of the config",
    )
    p.add_argument(
        "--data",
        "-d",
        action="append",
        help="Parquet file in the verl schema (repeat for several); default: data.val_files",
    )
    p.add_argument(
        "--n", type=int, default=1, help="samples per prompt (default 1: greedy); n > 1 gives pass@k"
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="default: 0 (greedy) for n = 1, rollout.temperature for n > 1",
    )
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: rollout.max_new_tokens")
    p.add_argument(
        "--correct-at",
        type=float,
        default=CORRECT_AT,
        help="a sample is correct when its reward is at least this (default 1.0)",
    )
    p.add_argument(
        "--output",
        "-o",
        default="eval_report.json",
        help="JSON report; samples go to <stem>.samples.jsonl beside it",
    )
    p.add_argument("--config", "-c", help="job YAML file for the other settings")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def resolve_eval_model(spec: str) -> Path:
    """A model folder as is; a checkpoints folder or run folder -> its latest complete checkpoint."""
    from rlfleet.models.resolve import resolve_model_path

    if spec == BUILTIN_MODEL:
        return resolve_model_path(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ConfigError(f"--model {spec}: no such file or folder")
    if (path / "config.json").is_file():
        return path
    from services.learner.checkpoint import latest_checkpoint

    for root in (path / "checkpoints", path):
        found = latest_checkpoint(root) if root.is_dir() else None
        if found is not None:
            return found
    raise ConfigError(
        f"--model {spec}: not a model folder (no config.json), a checkpoint or a run folder "
        f"with checkpoints/step_N"
    )


def _sampling(args: argparse.Namespace, cfg):
    from rlfleet.types import SamplingParams

    if args.n < 1:
        raise ConfigError(f"--n must be at least 1, not {args.n}")
    temperature = args.temperature
    if temperature is None:
        temperature = 0.0 if args.n == 1 else cfg.rollout.temperature
    if temperature < 0:
        raise ConfigError(f"--temperature must be >= 0, not {temperature}")
    if args.n > 1 and temperature == 0:
        raise ConfigError(
            "--n > 1 with greedy decoding (temperature 0) gives n identical samples; "
            "set --temperature > 0 for pass@k"
        )
    max_new = args.max_new_tokens or cfg.rollout.max_new_tokens
    return SamplingParams(
        n=args.n,
        temperature=temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        max_new_tokens=max_new,
        stop=tuple(cfg.rollout.stop),
        seed=cfg.run.seed,
    )


def reward_scorer(cfg):
    """What training scores with, in-process: the reward service's core (`reward.sources` combined, else
    `reward.model.path`, else `reward.fn`)."""
    from rlfleet.rpc.security import Security
    from services.reward.build import build_scorer

    # the job's TLS and token, for the channels to external reward servers
    return build_scorer(cfg.reward, cfg.controller.connect_timeout_s,
                        Security.from_config(cfg.security, cfg.limits))


def reward_rules(cfg, data_sources) -> dict[str, str]:
    """The rule each data_source was scored by, for the report: a built-in's name and what it reads,
    a user function's import path, the reward model, or the combined reward.sources; with an
    environment, its reward first."""
    rules = _reward_rules(cfg, data_sources)
    if cfg.env.enabled:  # an episode the environment rewarded keeps that reward (rlfleet/eval/runner.py)
        env = cfg.env.name or cfg.env.address
        return {src: f"env {env}, else {rule}" for src, rule in rules.items()}
    return rules


def _reward_rules(cfg, data_sources) -> dict[str, str]:
    if cfg.reward.sources:
        rule = "reward.sources: " + ", ".join(s.name for s in cfg.reward.sources)
        return dict.fromkeys(data_sources, rule)
    if cfg.reward.model.path:
        return dict.fromkeys(data_sources, f"reward model {cfg.reward.model.path}")
    from services.reward.registry import rule_label

    return {src: rule_label(cfg.reward.fn, src) for src in data_sources}


@contextlib.contextmanager
def environment_address(cfg, security) -> Iterator[str]:
    """The address of the job's environment server while the evaluation runs: env.address once it
    answers SERVING, else env.name served here (as `rlfleet run` serves it, with the same security)."""
    from rlfleet.rpc.channel import wait_until_serving

    env = cfg.env
    if env.address and env.kind == "openenv":
        from rlfleet.rpc.openenv_wire import wait_until_healthy

        wait_until_healthy(env.address, cfg.controller.connect_timeout_s)
        yield env.address
        return
    if env.address:
        wait_until_serving(env.address, "environment", cfg.controller.connect_timeout_s,
                           security=security).close()
        yield env.address
        return
    from rlfleet.app.env_sdk import EnvServer

    server = EnvServer(env.name, "127.0.0.1", env.port, env.params, max_workers=env.max_concurrency + 4,
                       security=security)
    try:
        print(f"rlfleet: environment {env.name}@{server.address}", flush=True)
        yield server.address
    finally:
        server.stop(grace_s=1.0)


def run(args: argparse.Namespace) -> int:
    from rlfleet.config import load_config

    cfg = load_config(args.config, args.overrides)
    files = args.data or cfg.data.val_files
    if not files:
        raise ConfigError("rlfleet eval needs --data FILE.parquet (or data.val_files in the config)")
    params = _sampling(args, cfg)  # bad options fail before the slow imports and the model load
    model_path = resolve_eval_model(args.model or cfg.model.path)

    from rlfleet.data.prompts import load_prompts
    from rlfleet.devices import resolve_device, resolve_dtype
    from rlfleet.eval.report import format_table, write_report
    from rlfleet.eval.runner import run_eval
    from rlfleet.eval.scoring import summarize
    from rlfleet.models.context import resolve_prompt_length
    from rlfleet.rpc.security import Security
    from services.rollout.engines.hf import HFEngine

    security = Security.from_config(cfg.security, cfg.limits)
    scorer = reward_scorer(cfg)  # a bad reward.fn fails before the policy loads
    with contextlib.ExitStack() as stack:
        if hasattr(scorer, "close"):
            stack.callback(scorer.close)
        env_address = stack.enter_context(environment_address(cfg, security)) if cfg.env.enabled else None
        device = resolve_device(cfg.rollout.device)
        engine = HFEngine(
            model_path, device, resolve_dtype(cfg.model.dtype, device), cfg.rollout.max_batch_sequences,
            cfg.rollout.hf_decode, cfg.rollout.cuda_graphs, cfg.rollout.compile_decode,
        )
        generate = engine.generate
        if env_address is not None:  # every sample an episode, played by the rollout's agent loop
            from services.rollout.agent_loop import build_agent

            agent = build_agent(engine, cfg.rollout, cfg.env.model_copy(update={"address": env_address}),
                                security)
            stack.callback(agent.env.close)
            generate = agent.generate
        max_prompt = resolve_prompt_length(
            cfg.data.max_prompt_length, params.max_new_tokens, model_path, str(model_path),
            new_tokens_key="--max-new-tokens" if args.max_new_tokens else "rollout.max_new_tokens",
        )
        tools = None
        if env_address is not None:  # the environment's tools in the prompts, as in training
            from rlfleet.rpc.env_describe import job_tool_prompt

            tools = job_tool_prompt(cfg.env.model_copy(update={"address": env_address}),
                                    cfg.controller.connect_timeout_s, engine.tokenizer, security)
            if tools is not None:
                print(f"rlfleet: the environment's tools in every prompt: {tools.summary()}", flush=True)
        prompts, too_long = load_prompts([Path(f) for f in files], engine.tokenizer, cfg.data.prompt_key,
                                         max_prompt, tools)
        if too_long:
            print(
                f"rlfleet: {too_long} prompts longer than "
                f"data.max_prompt_length={max_prompt} "
                f"tokens left out"
            )
        start = time.perf_counter()
        samples = run_eval(
            prompts,
            generate,
            scorer.score,
            params,
            prompts_per_request=max(1, cfg.rollout.max_batch_sequences // params.n),
            progress=True,
            episodes=env_address is not None,
        )
    summary = summarize(samples, params.n, args.correct_at)
    for src, rule in reward_rules(cfg, list(summary["by_source"])).items():
        summary["by_source"][src]["rule"] = rule
    meta = {
        "model": str(model_path),
        "data": [str(f) for f in files],
        "filtered_too_long": too_long,
        "params": {
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "max_new_tokens": params.max_new_tokens,
            "seed": params.seed,
        },
        "seconds": round(time.perf_counter() - start, 3),
    }
    if cfg.env.enabled:
        meta["env"] = {"name": cfg.env.name, "address": cfg.env.address or env_address,
                       "max_turns": cfg.rollout.max_turns}
    report, samples_path = write_report(args.output, summary, samples, meta)
    print(format_table(summary))
    print(f"rlfleet: report {report}, samples {samples_path}")
    return 0
