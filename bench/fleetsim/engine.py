"""A rollout engine that models a GPU (bench/fleetsim/gpu_model.py) instead of running a model.

It implements services.rollout.engine.RolloutEngine and is created through the engine registry
(`rollout.backend=sim` once bench/fleetsim/plugin.py is in `algorithm.plugins`), so the real
RolloutServicer serves it: Generate streams each group when the modelled GPU would have finished
it, PullWeights waits for the learner's push in the modelled weight group (bench/fleetsim/rendezvous.py)
and then serves the new version. Token ids and
log-probs are slices of fixed arrays: the payload has the real size, its content means nothing.

Every engine keeps a log of what it did (busy intervals, each group's due and actual send time),
which the replica host writes out for bench/fleetsim/measure.py.
"""
from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Iterator

from rlfleet.errors import WeightSyncError
from rlfleet.types import Completion, GroupResult, PromptRequest, SamplingParams
from services.rollout.engine import RolloutEngine, check_prompts
from bench.fleetsim.gpu_model import GpuModel
from bench.fleetsim.rendezvous import RendezvousMember

GPU_ENV = "RLFLEET_SIM_GPU"  # JSON of GpuModel's fields; unset: the defaults
VOCAB = 64  # the simulator's model folder (bench/fleetsim/model_dir.py)


def _seq_of(request_id: str) -> int:
    """The controller's admission number in a request id `p<index>-s<seq>` (controller/state.py)."""
    return int(request_id.rsplit("-s", 1)[1]) if "-s" in request_id else -1


class SimEngine(RolloutEngine):
    def __init__(self, model: GpuModel, seed: int = 0):
        self.model = model
        self.factor = 1.0  # > 1: a straggler, this many times slower than the rest
        self.policy_version = 0
        self._rng = random.Random(seed)
        self._world_size = 1
        self._member: RendezvousMember | None = None  # this replica's rank in the weight group
        self._tokens = [(i * 7 + 3) % (VOCAB - 3) + 3 for i in range(model.max_new_tokens * 4)]
        self._logprobs = [-0.5] * len(self._tokens)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self.busy: list[tuple[float, float]] = []   # (start, end) of each Generate, wall clock
        self.pulls: list[tuple[float, float]] = []
        self.sent: list[tuple[int, float, float, int]] = []  # (seq, due, sent, version)

    def generate(self, prompts: list[PromptRequest], params: SamplingParams) -> Iterator[GroupResult]:
        check_prompts(prompts, params, VOCAB, 1 << 20, "the simulator's context")
        cap = params.max_new_tokens
        with self._lock:
            lengths = [[self.model.response_length(self._rng, cap) for _ in range(params.n)] for _ in prompts]
            answers = [[self._rng.randint(0, 30) for _ in range(params.n)] for _ in prompts]
        due = self.model.request_s([len(p.prompt_ids) for p in prompts], lengths, self.factor)
        start, version = time.time(), self.policy_version
        try:
            for i in sorted(range(len(prompts)), key=due.__getitem__):
                if self._stopped.wait(max(0.0, start + due[i] - time.time())):
                    return  # the replica was killed: its stream just ends with the server
                completions = [Completion(self._tokens[:n], self._logprobs[:n],
                                          "length" if n == cap else "stop",
                                          version, text=f"The answer is #### {a}",
                                          last_policy_version=self.policy_version)
                               for n, a in zip(lengths[i], answers[i])]
                self.sent.append((_seq_of(prompts[i].request_id), start + due[i], time.time(), version))
                yield GroupResult(prompts[i].request_id, completions)
        finally:
            self.busy.append((start, time.time()))

    def join_weight_group(self, address: str, rank: int, world_size: int, backend: str, timeout_s: float,
                          token: str | None = None) -> None:
        self._world_size = world_size
        if self._member is not None:
            self._member.close()
        self._member = RendezvousMember(address, rank, timeout_s)

    def pull_weights(self, version: int) -> dict[str, float]:
        """Blocks until the learner's push of `version` ends (bench/fleetsim/rendezvous.py: the
        rendezvous, a dead member hanging the broadcast, then the modelled broadcast's time)."""
        start = time.time()
        if self._member is None:
            raise WeightSyncError("no weight group joined")
        self._member.pull(version)
        self.policy_version = version
        self.pulls.append((start, time.time()))
        return {"version": version, "bytes": float(self.model.link.bytes), "seconds": time.time() - start}

    def close(self) -> None:
        self._stopped.set()
        if self._member is not None:
            self._member.close()

    def log(self) -> dict:
        return {"busy": self.busy, "pulls": self.pulls, "sent": self.sent, "factor": self.factor}


def create_engine(path, device, dtype, rollout_cfg, seed: int) -> SimEngine:
    """`rollout.backend=sim`: the GPU model comes from $RLFLEET_SIM_GPU (JSON), else the defaults."""
    fields = json.loads(os.environ[GPU_ENV]) if os.environ.get(GPU_ENV) else {}
    return SimEngine(GpuModel(**fields), seed=seed)
