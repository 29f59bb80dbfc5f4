"""The learner's own torch.distributed world (learner.world_size > 1), and how rank 0 drives it.

The world is torchrun's: ``init_learner_world`` joins the default process group from the
environment torchrun sets (env://). Only rank 0 serves gRPC; it announces every command
(Train, PushWeights, SaveCheckpoint, Stop) to the other ranks before it runs the command itself,
and they run the same command on their shards (``worker_loop``).

Commands travel as tensors over the default group, never pickled: a fixed int64 header, then
for Train the batch as a few flat tensors (token ids, lengths, log-probs, advantages, rewards).
The learner's weight group with the rollouts is a separate group on its own TCPStore
(rlfleet.weights.group), so the two never collide.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
import logging
import os
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist

from rlfleet.errors import Busy, RlfleetError, VersionMismatch, WeightSyncError
from rlfleet.types import TrainBatch, TrainResult, TrainSample
from services.learner.batching import validate_samples
from services.learner.flatten import flat, loss_masks

_HEADER = 6


class Op(IntEnum):
    STOP = 0
    TRAIN = 1
    PUSH = 2
    CHECKPOINT = 3
    HEARTBEAT = 4  # rank 0 is idle: the others' wait for the next command must not time out


@dataclass(frozen=True)
class LearnerWorld:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device  # where this rank trains
    comm_device: torch.device  # where command tensors live (the GPU under NCCL)


class LearnerWorldError(RlfleetError, RuntimeError):
    """The learner's ranks can no longer be kept in step; restart the learner."""


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) from torchrun's environment, or None outside torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))


def init_learner_world(expected_size: int, device_spec: str, first_gpu: int,
                       timeout_s: float) -> LearnerWorld:
    """Join torchrun's default process group (gloo on CPU, NCCL on GPUs: GPU first_gpu + local rank)."""
    from rlfleet.devices import resolve_device
    from rlfleet.errors import ConfigError

    env = torchrun_env()
    if env is None:
        raise ConfigError(f"learner.world_size={expected_size} needs torchrun: start it with `python -m "
                          f"torch.distributed.run --standalone --nproc-per-node {expected_size} -m "
                          "rlfleet.app.cli serve learner …` (rlfleet run does this)")
    rank, world_size, local_rank = env
    if world_size != expected_size:
        raise ConfigError(f"learner.world_size={expected_size} but torchrun started {world_size} processes")
    device = resolve_device(device_spec, prefer_index=first_gpu + local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)
    return LearnerWorld(rank, world_size, local_rank, device,
                        device if backend == "nccl" else torch.device("cpu"))


def exit_learner_world(code: int = 0) -> NoReturn:
    """Ends a learner rank's process once its work is done: destroys the process group, flushes the
    logs and output, and leaves without the interpreter's teardown. With FSDP2 over gloo (torch 2.13,
    CPU) that teardown aborted in C++ destructors about 1 exit in 5 after all the work had finished
    ("terminate called without an active exception", SIGABRT; 5 of 25 runs of
    tests/unit/fsdp_worker.py, 0 of 25 with this), and torchrun reported the rank as failed."""
    dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---- commands as tensors --------------------------------------------------------------------
def _broadcast(t: torch.Tensor, world: LearnerWorld) -> torch.Tensor:
    t = t.to(world.comm_device)
    dist.broadcast(t, src=0)
    return t.cpu()


def send_command(world: LearnerWorld, op: Op, *args: int) -> None:
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0] = int(op)
    header[1:1 + len(args)] = torch.tensor(args, dtype=torch.int64)
    _broadcast(header, world)


def receive_command(world: LearnerWorld) -> tuple[Op, list[int]]:
    header = _broadcast(torch.zeros(_HEADER, dtype=torch.int64), world).tolist()
    return Op(header[0]), header[1:]


def send_batch(world: LearnerWorld, batch: TrainBatch) -> None:
    samples = batch.samples
    lengths = torch.tensor([[len(s.prompt_ids), len(s.response_ids), s.generation_version] for s in samples],
                           dtype=torch.int64)
    # lists or the data plane's numpy columns (services/learner/flatten.py): one array each
    ids = torch.from_numpy(flat((seq for s in samples for seq in (s.prompt_ids, s.response_ids)), np.int64))
    logprobs = torch.from_numpy(flat((s.behaviour_logprobs for s in samples), np.float64))
    masks = torch.from_numpy(flat(loss_masks(samples, np.int64), np.int64))
    floats = torch.tensor([batch.temperature] + [v for s in samples for v in (s.advantage, s.reward)],
                          dtype=torch.float64)
    send_command(world, Op.TRAIN, batch.step, batch.expected_version, len(samples), ids.numel(),
                 logprobs.numel())
    for t in (lengths, ids, logprobs, masks, floats):
        _broadcast(t, world)


def receive_batch(world: LearnerWorld, args: list[int]) -> TrainBatch:
    step, expected_version, n, n_ids, n_logprobs = args[:5]
    lengths = _broadcast(torch.zeros((n, 3), dtype=torch.int64), world).tolist()
    ids = _broadcast(torch.zeros(n_ids, dtype=torch.int64), world).tolist()
    logprobs = _broadcast(torch.zeros(n_logprobs, dtype=torch.float64), world).tolist()
    masks = _broadcast(torch.zeros(n_logprobs, dtype=torch.int64), world).tolist()  # one per response token
    floats = _broadcast(torch.zeros(1 + 2 * n, dtype=torch.float64), world).tolist()
    samples, at, at_lp = [], 0, 0
    for i, (p, r, generation_version) in enumerate(lengths):
        samples.append(TrainSample(prompt_ids=ids[at:at + p], response_ids=ids[at + p:at + p + r],
                                   behaviour_logprobs=logprobs[at_lp:at_lp + r], advantage=floats[1 + 2 * i],
                                   generation_version=generation_version, reward=floats[2 + 2 * i],
                                   loss_mask=masks[at_lp:at_lp + r]))
        at, at_lp = at + p + r, at_lp + r
    return TrainBatch(step=step, samples=samples, temperature=floats[0], expected_version=expected_version)


# ---- rank 0 -----------------------------------------------------------------------------------
class LearnerFront:
    """What the servicer drives on rank 0: checks a command can run, announces it to the other
    ranks, then runs it on its own shard. One command at a time, so the ranks' collectives stay
    in the same order."""

    def __init__(self, learner, world: LearnerWorld, heartbeat_s: float = 60.0) -> None:
        self.learner, self.world = learner, world
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._stopped = threading.Event()
        self._heartbeat_s = heartbeat_s
        threading.Thread(target=self._heartbeat, name="learner-world-heartbeat", daemon=True).start()

    @property
    def version(self) -> int:
        return self.learner.version

    @property
    def step(self) -> int:
        return self.learner.step

    @property
    def checkpoint_dir(self) -> Path:
        return self.learner.checkpoint_dir

    @property
    def model(self):
        """The sharded policy (the servicer reads its vocabulary size to validate token ids)."""
        return self.learner.model

    def _check(self) -> None:
        if self._broken:
            raise LearnerWorldError(self._broken)

    def _serial(self):
        """One command at a time, on this rank's GPU: the current CUDA device is per thread, and gRPC
        runs each call on a pool thread (whose current device would otherwise be GPU 0)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self._lock)
        if self.world.device.type == "cuda":
            stack.enter_context(torch.cuda.device(self.world.device))
        return stack

    def train(self, batch: TrainBatch) -> TrainResult:
        validate_samples(batch.samples, self.learner.max_seq_len)
        with self._serial():
            self._check()
            repeat = self.learner.step_results.lookup(batch)  # before the other ranks hear of it
            if repeat is not None:
                return repeat
            if batch.expected_version >= 0 and batch.expected_version != self.learner.version:
                raise VersionMismatch(f"train step {batch.step} expected policy version "
                                      f"{batch.expected_version}, learner is at {self.learner.version}")
            send_batch(self.world, batch)
            return self._run(lambda: self.learner.train(batch), "train step")

    def open_weight_group(self, *args, **kwargs) -> tuple[str, str]:
        # Rank 0 only (the weight group is rank 0's business) and no command to the other ranks, so
        # it does not wait for a step or a push (weight_groups.py: an Open replaces no group).
        return self.learner.open_weight_group(*args, **kwargs)

    def push_weights(self, version: int, digest: bool = False, group: str = "",
                     exclusive: Callable[[float], AbstractContextManager] | None = None,
                     ) -> dict[str, float | str]:
        """`exclusive`: the service's one weight operation at a time, entered once the group's ranks
        have all arrived (Learner.push_weights)."""
        with self._serial():
            self._check()
            hosted = self.learner.weight_groups.find(group)
            sender = hosted.sender
            if version != self.learner.version:
                raise VersionMismatch(f"push of version {version} asked, learner is at "
                                      f"{self.learner.version}")
            # Wait for the rollouts before the other ranks start gathering: a rollout that never
            # comes fails this push here, with the learner world still in step.
            try:
                with hosted.group.bounded():
                    hosted.group.connect()
            except WeightSyncError:
                self.learner.weight_groups.done(hosted, "failed")
                raise
            try:
                with (exclusive or (lambda wait_s: nullcontext()))(hosted.group.time_left()):
                    send_command(self.world, Op.PUSH, version, sender.bucket_bytes, int(sender.checksums),
                                 int(digest))
                    # A WeightSyncError (a rollout failed) leaves the ranks in step: rank 0 finished the
                    # gathers.
                    return self._run(lambda: self.learner.push_weights(version, digest=digest,
                                                                       group=hosted.address),
                                     "weight push", in_step=(WeightSyncError,))
            except Busy:  # another push held the service past this group's time: its ranks wait in vain
                self.learner.weight_groups.done(hosted, "failed")
                raise

    def save_checkpoint(self, step: int) -> Path:
        with self._serial():
            self._check()
            send_command(self.world, Op.CHECKPOINT, step)
            return self._run(lambda: self.learner.save_checkpoint(step), "checkpoint")

    def _heartbeat(self) -> None:
        """While no command runs, tell the other ranks every heartbeat_s that rank 0 is alive: they
        wait for the next command in a collective, which would otherwise time out between steps."""
        while not self._stopped.wait(self._heartbeat_s):
            if not self._lock.acquire(blocking=False):
                continue  # a command is running: the ranks are busy together
            try:
                if self._broken or self._stopped.is_set():
                    continue
                with torch.cuda.device(self.world.device) if self.world.device.type == "cuda" \
                        else contextlib.nullcontext():
                    send_command(self.world, Op.HEARTBEAT)
            except Exception as exc:  # noqa: BLE001 - a rank died: torchrun ends the job; say why meanwhile
                self._broken = f"the learner's other ranks are gone ({type(exc).__name__}: {exc})"
            finally:
                self._lock.release()

    def stop(self) -> None:
        self._stopped.set()
        with self._serial():
            if not self._broken:
                send_command(self.world, Op.STOP)
                self._broken = "the learner world was stopped"

    def _run(self, command, what: str, in_step: tuple[type[Exception], ...] = ()):
        try:
            return command()
        except in_step:
            raise
        except Exception as exc:
            # The other ranks may be inside a collective this rank left: they cannot be brought
            # back in step, so every later command fails until the learner restarts.
            self._broken = (f"a {what} failed part-way on learner rank 0 ({type(exc).__name__}: {exc}); "
                            "the learner's ranks are out of step, restart the learner")
            raise
