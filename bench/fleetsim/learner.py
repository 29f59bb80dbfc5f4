"""A simulated learner behind the real LearnerServicer: training takes tokens / rate, a push takes
the modelled weight group's time: the rendezvous, a dead member hanging the broadcast until the
group's timeout, then the modelled broadcast (bench/fleetsim/rendezvous.py, gpu_model.py).

The learner core has no abstract interface of its own (services/learner/learner.py's Learner is
concrete); SimLearner offers the attributes and methods LearnerServicer calls on it. Train keeps
the real idempotence (services/learner/step_results.py) and version check. While the file
`<out>/learner.pause` exists, Train waits (the churn run's "learner paused for 30 s").

    python -m bench.fleetsim.learner CONFIG OUT_DIR TOKENS_PER_S   (a process of its own)
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
import threading
import time
from pathlib import Path

from rlfleet.errors import VersionMismatch
from rlfleet.types import TrainBatch, TrainResult
from services.learner.step_results import StepResults
from bench.fleetsim.gpu_model import GpuModel
from bench.fleetsim.rendezvous import RendezvousServer


class SimLearner:
    def __init__(self, model: GpuModel, tokens_per_s: float, out_dir: Path):
        self.gpu, self.tokens_per_s = model, tokens_per_s
        self.out_dir = out_dir
        self.checkpoint_dir = out_dir / "checkpoints"
        self.version, self.step = 0, 0
        self.step_results = StepResults()
        self._groups: dict[str, tuple[int, float]] = {}  # address -> world size, timeout
        self.rendezvous = RendezvousServer()
        self._last = ""
        self._lock = threading.Lock()
        self._log = open(out_dir / "learner.jsonl", "a", buffering=1)  # noqa: SIM115 - for the process

    def train(self, batch: TrainBatch) -> TrainResult:
        arrived = time.time()
        with self._lock:
            repeat = self.step_results.lookup(batch)
            if repeat is not None:
                return repeat
            if batch.expected_version >= 0 and batch.expected_version != self.version:
                raise VersionMismatch(f"train step {batch.step} expected policy version "
                                      f"{batch.expected_version}, learner is at {self.version}")
            paused = time.time()
            while (self.out_dir / "learner.pause").exists():
                time.sleep(0.05)
            paused = time.time() - paused
            tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in batch.samples)
            seconds = tokens / self.tokens_per_s * self.gpu.slowdown
            time.sleep(seconds)
            self.version += 1
            self.step = batch.step
            metrics = {"actor/pg_loss": 0.0, "actor/entropy": 0.0, "actor/grad_norm": 0.0, "actor/lr": 0.0,
                       "actor/pg_clipfrac": 0.0, "learner/tokens": float(tokens),
                       "timing/learner_step_s": seconds}
            result = TrainResult(policy_version=self.version, metrics=metrics)
            self.step_results.record(batch, result)
            self._log.write(json.dumps({"step": batch.step, "arrived": arrived, "done": time.time(),
                                        "samples": len(batch.samples), "tokens": tokens,
                                        "modelled_s": seconds, "paused_s": paused}) + "\n")
            return result

    def open_weight_group(self, world_size: int, host: str, timeout_s: float, token: str | None = None,
                          members: list[str] | None = None) -> tuple[str, str]:
        address = self.rendezvous.open(world_size)  # a group is named by its address
        self._groups[address] = (world_size, timeout_s)
        self._last = address
        return address, "nccl"

    def push_weights(self, version: int, digest: bool = False, group: str = "",
                     exclusive: Callable[[float], AbstractContextManager] | None = None,
                     ) -> dict[str, float | str]:
        """Pushes to the group at `group` (empty: the one opened last), as the real learner does;
        `exclusive` (the service's one push at a time) is held for the transfer."""
        with (exclusive or (lambda wait_s: nullcontext()))(60.0), self._lock:
            if version != self.version:
                raise VersionMismatch(f"push of version {version} asked, learner is at {self.version}")
            start = time.perf_counter()
            address = group or self._last
            world_size, timeout_s = self._groups[address]
            self.rendezvous.push(address, version, timeout_s, self.gpu.broadcast_s(world_size))
            return {"bytes": self.gpu.link.bytes, "seconds": time.perf_counter() - start}

    def abort_weight_group(self, group: str, reason: str) -> bool:
        """As the real learner's: the push on `group` ends at once (it holds no lock of ours to wait for)."""
        return self.rendezvous.abort(group, reason)

    def save_checkpoint(self, step: int) -> Path:
        path = self.checkpoint_dir / f"step_{step}"
        path.mkdir(parents=True, exist_ok=True)
        return path


def main() -> None:
    from rlfleet.config import load_config
    from rlfleet.proto.v1 import learner_pb2_grpc
    from rlfleet.rpc.service_main import run_service
    from services.learner.servicer import SERVICE_NAME, LearnerServicer
    from bench.fleetsim.engine import GPU_ENV
    import os

    config, out_dir, tokens_per_s = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    cfg = load_config(config)
    gpu = GpuModel(**json.loads(os.environ.get(GPU_ENV) or "{}"))
    servicer = LearnerServicer(host=cfg.learner.host, limits=cfg.limits)
    staging = None
    if cfg.controller.data_plane == "flight":  # as `rlfleet serve learner` does
        from rlfleet.app.serve import serve_staging
        from rlfleet.dataplane.flight import PayloadClient
        from rlfleet.rpc.security import Security

        security = Security.from_config(cfg.security, cfg.limits)
        servicer.payloads = PayloadClient(security, timeout_s=cfg.controller.rpc_timeout_s)
        if cfg.learner.staging_max_tokens:
            staging, servicer.payload_sink = serve_staging(cfg, security)
            servicer.staging = staging.store
    try:
        run_service("learner", cfg, cfg.learner, [SERVICE_NAME],
                    learner_pb2_grpc.add_LearnerServicer_to_server, servicer,
                    lambda: servicer.attach(SimLearner(gpu, tokens_per_s, out_dir)), uses_torch=False)
    finally:
        if staging is not None:
            staging.shutdown()


if __name__ == "__main__":
    main()
