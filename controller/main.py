"""`rlfleet controller`: connects to running services and runs the GRPO loop."""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from rlfleet.config import JobConfig
from rlfleet.data.prompts import PromptSource, load_prompts
from rlfleet.data.tasks import write_parquet
from rlfleet.errors import CheckpointError, DataError
from rlfleet.models.context import resolve_prompt_length
from rlfleet.models.identity import architecture, model_summary
from rlfleet.models.prompt_tokenizer import load_prompt_tokenizer
from rlfleet.rpc.env_describe import job_tool_prompt
from rlfleet.models.resolve import resolve_model_path
from rlfleet.rpc.security import Security
from rlfleet.rpc.service_main import announce
from controller.clients import LearnerClient, RewardClient, RolloutClient
from controller.evaluation import PeriodicEval
from controller.fleet import JOIN_CHECK_S, Fleet
from controller.journal import Journal
from controller.loop import GRPOLoop
from controller.reward_tally import RewardTally
from controller.outputs import RunWriter
from controller.state import describe_resume, load_state, resolve_resume, restore_source, truncate_jsonl
from controller.status_servicer import start_status_server
from controller.telemetry import ControllerTelemetry
from controller.tracking import make_sinks

log = structlog.get_logger(__name__)


def train_files(cfg: JobConfig) -> list[Path]:
    """The configured Parquet files, or the built-in task written into the run folder."""
    if cfg.data.train_files:
        return [Path(f) for f in cfg.data.train_files]
    path = cfg.run.dir / "data" / "builtin_train.parquet"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_parquet(path, cfg.data.builtin_size, cfg.run.seed)
    return [path]


def check_data_files(cfg: JobConfig) -> None:
    """Every data file the run will read exists: data.train_files, and data.val_files when
    controller.eval_every reads them. `rlfleet run` asks before it touches the run folder."""
    keys = [("data.train_files", cfg.data.train_files)]
    if cfg.controller.eval_every:
        keys.append(("data.val_files", cfg.data.val_files))
    for key, files in keys:
        for f in files:
            if not Path(f).is_file():
                raise DataError(f"data file {f} ({key}) does not exist")


def prompt_length_limit(cfg: JobConfig, model_dir: Path) -> int:
    """data.max_prompt_length, or what the model's context leaves after rollout.max_new_tokens."""
    max_model_len = cfg.rollout.max_model_len if cfg.rollout.backend == "vllm" else None
    return resolve_prompt_length(cfg.data.max_prompt_length, cfg.rollout.max_new_tokens, model_dir,
                                 cfg.model.path, max_model_len=max_model_len)


def rollout_addresses(addresses: dict[str, str]) -> list[str]:
    """The rollout replicas' addresses: `rollout`, then `rollout-1`, `rollout-2`, …"""
    names = [n for n in addresses if n == "rollout" or n.startswith("rollout-")]
    return [addresses[n] for n in sorted(names, key=lambda n: 0 if n == "rollout" else int(n.split("-")[1]))]


@dataclass
class ControllerData:
    """What the controller reads before it talks to any service: prompts and evaluation set."""
    source: PromptSource
    evaluator: PeriodicEval | None


def prepare_data(cfg: JobConfig) -> ControllerData:
    """Renders and measures the prompts; needs no service but the environment server (its tools),
    so `rlfleet run` does it while the others start."""
    model_dir = resolve_model_path(cfg.model.path)
    max_prompt = prompt_length_limit(cfg, model_dir)  # an error naming the keys before any work starts
    tokenizer = load_prompt_tokenizer(model_dir)  # no torch here (rlfleet/models/prompt_tokenizer.py)
    files = train_files(cfg)
    # The environment's tools go into the prompts (env.tools_in_prompt): it must be serving by now.
    tools = job_tool_prompt(cfg.env, cfg.controller.connect_timeout_s, tokenizer,
                            Security.from_config(cfg.security, cfg.limits))
    if tools is not None:
        print(f"rlfleet: the environment's tools in every prompt: {tools.summary()}", flush=True)
    prompts, filtered = load_prompts(files, tokenizer, cfg.data.prompt_key, max_prompt, tools)
    log.info("prompts loaded", count=len(prompts), filtered_too_long=filtered, max_prompt_length=max_prompt)
    print(f"rlfleet: {len(prompts)} training prompts from {', '.join(f.name for f in files)}"
          + (f"; {filtered} left out, longer than data.max_prompt_length={max_prompt} tokens"
             if filtered else ""),
          flush=True)
    return ControllerData(PromptSource(prompts, shuffle=cfg.data.shuffle, seed=cfg.run.seed),
                          PeriodicEval.from_config(cfg, tokenizer, max_prompt, tools))


def run_controller(cfg: JobConfig, addresses: dict[str, str], stop: threading.Event | None = None,
                   on_step: Callable[[dict[str, Any]], None] | None = None,
                   alive: Callable[[], bool] = lambda: True,
                   data: ControllerData | None = None) -> dict[str, Any]:
    """`data`: prepare_data(cfg) when done already (while the services started)."""
    cc = cfg.controller
    data = data if data is not None else prepare_data(cfg)
    source, evaluator = data.source, data.evaluator

    loop_ref: list[GRPOLoop] = []
    security = Security.from_config(cfg.security, cfg.limits)  # of the status server and every client
    status = start_status_server(cc.host, cc.port, cfg.run.name, addresses,
                                 lambda: loop_ref[0] if loop_ref else None, security)
    telemetry = ControllerTelemetry()
    announce(cfg.run.dir, "controller", status.address, telemetry.serve(cc.host, cc.metrics_port))

    def step_done(metrics: dict[str, Any]) -> None:
        telemetry.observe_step(metrics)
        log.info("step done", reward=metrics["reward/mean"], pg_loss=metrics["actor/pg_loss"],
                 staleness=metrics["staleness/mean"], step_s=round(metrics["timing/step_s"], 3))
        if on_step is not None:
            on_step(metrics)

    clients = []
    try:
        kw = dict(timeout_s=cc.rpc_timeout_s, connect_timeout_s=cc.connect_timeout_s, alive=alive,
                  security=security)
        rollout = [RolloutClient(address, **kw) for address in rollout_addresses(addresses)]
        clients.extend(rollout)
        # The reward service scores every sample (combining reward.sources when set).
        tally = (RewardTally([s.name for s in cfg.reward.sources], cfg.reward.max_consecutive_failures)
                 if cfg.reward.sources else None)
        reward = RewardClient(addresses["reward"], tally=tally, **kw)
        clients.append(reward)
        learner = LearnerClient(addresses["learner"], **kw)
        clients.append(learner)
        resume = None
        if cc.resume:  # controller/state.py: data cursor, prompts not yet trained, step and version
            state_file, checkpoint = resolve_resume(cfg.run.dir, cc.resume, learner.checkpoints())
            resume = load_state(state_file)
            restore_source(source, resume.source)
            for name in ("metrics.jsonl", "samples/train.jsonl"):  # lines written after that checkpoint
                truncate_jsonl(cfg.run.dir / name, resume.step)
            print(describe_resume(resume, checkpoint), flush=True)
            log.info("resuming", step=resume.step, policy_version=resume.policy_version,
                     checkpoint=checkpoint, requeued=sum(len(d["members"]) for d in resume.requeue))
        if resume is not None and learner.status().policy_version != resume.policy_version:
            raise CheckpointError(f"the learner at {learner.address} holds policy version "
                                  f"{learner.status().policy_version}, the checkpoint of step "
                                  f"{resume.step} has {resume.policy_version}: start it with "
                                  f"learner.resume_from={checkpoint}")
        writer = RunWriter(cfg.run.dir, tensorboard=cfg.tracking.tensorboard, sinks=make_sinks(cfg))
        journal = Journal(cfg.run.dir)  # <run_dir>/journal/prompts.jsonl
        # a joiner is called back briefly and quietly: it serves before it joins (controller/fleet.py);
        # its channel pings it, with a call open or not, which watches it streaming or idle (Fleet.check)
        join_kw = dict(timeout_s=cc.rpc_timeout_s, connect_timeout_s=min(cc.connect_timeout_s, JOIN_CHECK_S),
                       security=security, report_every_s=None, keepalive=True)
        # Replicas may join while it runs (`rlfleet serve rollout --join`): same model, same token.
        model_dir = resolve_model_path(cfg.model.path)
        fleet = Fleet(rollout, architecture=architecture(model_dir), summary=model_summary(model_dir),
                      connect=lambda address: RolloutClient(address, **join_kw), note=journal.record)
        try:
            loop = GRPOLoop(cfg, source, rollout, reward, learner, writer, stop=stop, on_step=step_done,
                            evaluator=evaluator, journal=journal, resume=resume, fleet=fleet)
            loop_ref.append(loop)
            telemetry.watch_buffer(loop.buffered)
            return loop.run()
        finally:
            writer.close()
            journal.close()
    finally:
        for client in clients:
            client.close()
        for member in loop_ref[0].fleet.members() if loop_ref else []:
            member.client.close()
        status.stop(grace_s=1)
        telemetry.close()
