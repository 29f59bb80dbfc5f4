"""`rlfleet controller`: connects to running services and runs the GRPO loop."""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from transformers import AutoTokenizer

from rlfleet.config import JobConfig
from rlfleet.data.prompts import PromptSource, load_prompts
from rlfleet.data.tasks import write_parquet
from rlfleet.models.resolve import resolve_model_path
from rlfleet.proto.v1 import controller_pb2_grpc
from rlfleet.rpc.server import ServiceServer
from rlfleet.rpc.service_main import announce
from controller.clients import LearnerClient, RewardClient, RolloutClient
from controller.loop import GRPOLoop
from controller.outputs import RunWriter
from controller.status_servicer import SERVICE_NAME, ControllerServicer

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


def run_controller(cfg: JobConfig, addresses: dict[str, str], stop: threading.Event | None = None,
                   on_step: Callable[[dict[str, Any]], None] | None = None,
                   alive: Callable[[], bool] = lambda: True) -> dict[str, Any]:
    cc = cfg.controller
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model.path))
    prompts, filtered = load_prompts(train_files(cfg), tokenizer, cfg.data.prompt_key, cfg.data.max_prompt_length)
    log.info("prompts loaded", count=len(prompts), filtered_too_long=filtered)
    source = PromptSource(prompts, shuffle=cfg.data.shuffle, seed=cfg.run.seed)

    loop_ref: list[GRPOLoop] = []
    status = ServiceServer([SERVICE_NAME], cc.host, cc.port)
    status.add(controller_pb2_grpc.add_ControllerServicer_to_server,
               ControllerServicer(cfg.run.name, addresses, lambda: loop_ref[0] if loop_ref else None))
    status.start()
    status.mark_serving()
    announce(cfg.run.dir, "controller", status.address, 0)

    clients = []
    try:
        kw = dict(timeout_s=cc.rpc_timeout_s, connect_timeout_s=cc.connect_timeout_s, alive=alive)
        rollout = RolloutClient(addresses["rollout"], **kw)
        clients.append(rollout)
        reward = RewardClient(addresses["reward"], **kw)
        clients.append(reward)
        learner = LearnerClient(addresses["learner"], **kw)
        clients.append(learner)
        writer = RunWriter(cfg.run.dir)
        try:
            loop = GRPOLoop(cfg, source, rollout, reward, learner, writer, stop=stop, on_step=on_step)
            loop_ref.append(loop)
            return loop.run()
        finally:
            writer.close()
    finally:
        for client in clients:
            client.close()
        status.stop(grace_s=1)
