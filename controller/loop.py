"""The asynchronous GRPO loop with bounded staleness.

A generation thread keeps the rollout busy with new groups as long as the
staleness gate admits them, scores each finished group and buffers it; the
training loop takes `prompts_per_step` groups (oldest version first), trains,
and pushes the new weights. With `max_staleness=0` the gate admits a step's
groups only after the weights they will be trained against are served, which
is synchronous on-policy GRPO.
"""
from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, PromptSource
from rlfleet.errors import RlfleetError
from rlfleet.types import PromptRequest, SamplingParams, TrainBatch
from controller.clients import LearnerClient, RewardClient, RolloutClient
from controller.evaluation import PeriodicEval
from controller.groups import ScoredGroup, score_items
from controller.outputs import RunWriter
from controller.rewards import reward_metrics
from controller.sample_builder import SampleBuilder
from controller.staleness import StalenessGate
from controller.step_metrics import step_metrics
from controller.weight_sync import WeightSync

log = structlog.get_logger(__name__)


class Stopped(RlfleetError):
    """The loop was asked to stop."""


class GRPOLoop:
    def __init__(self, cfg: JobConfig, source: PromptSource, rollout: RolloutClient | list[RolloutClient],
                 reward: RewardClient,
                 learner: LearnerClient, writer: RunWriter, stop: threading.Event | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None,
                 evaluator: PeriodicEval | None = None):
        self.cfg = cfg
        self.source = source
        # Every replica has a generation thread that asks for work when it is free, which spreads
        # groups by load; all of them take each new version in one broadcast.
        self.rollouts = rollout if isinstance(rollout, list) else [rollout]
        self.rollout, self.reward, self.learner = self.rollouts[0], reward, learner
        self.writer = writer
        self.stop = stop or threading.Event()
        self.on_step = on_step
        self.evaluator = evaluator  # validation every controller.eval_every steps (controller/evaluation.py)
        self.B = cfg.controller.prompts_per_step
        self.gate = StalenessGate(self.B, cfg.controller.max_staleness)
        self.samples = SampleBuilder(cfg.algorithm, cfg.rollout.max_new_tokens)  # shaping, filter, advantages
        self.params = SamplingParams(
            n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k, max_new_tokens=cfg.rollout.max_new_tokens, stop=tuple(cfg.rollout.stop))
        self.sync = WeightSync(learner, self.rollouts, cfg.learner.weight_sync_timeout_s, cfg.learner.verify_weights)
        self._cond = threading.Condition()
        self._buffer: list[tuple[int, int, ScoredGroup]] = []  # heap by (version, seq)
        self._admitted = 0  # groups admitted that will still be consumed (dropped ones are given back)
        self._seq = 0
        self._rollout_version = 0
        self._error: BaseException | None = None
        self.last_metrics: dict[str, Any] = {}
        self.step = 0

    # ---- generation side ----------------------------------------------------------------------
    def _admit(self) -> dict[str, tuple[int, Prompt]]:
        """Blocks until the gate admits work; returns the prompts to request, by request id."""
        with self._cond:
            while not self.stop.is_set():
                limit = self.gate.admission_limit(self._rollout_version)
                if self._admitted < limit:
                    count = min(self.cfg.controller.prompts_per_request, limit - self._admitted)
                    self._admitted += count
                    prompts = {}
                    for _ in range(count):
                        prompt = self.source.next()
                        prompts[f"p{prompt.index}-s{self._seq}"] = (self._seq, prompt)
                        self._seq += 1
                    return prompts
                self._cond.wait(0.5)
        raise Stopped("stopping")

    def _generate_forever(self, rollout: RolloutClient) -> None:
        try:
            while not self.stop.is_set():
                prompts = self._admit()
                requests = [PromptRequest(rid, p.prompt_ids) for rid, (_, p) in prompts.items()]
                started = time.perf_counter()
                for group in rollout.generate(requests, self.params):
                    gen_s = time.perf_counter() - started
                    seq, prompt = prompts[group.request_id]
                    t0 = time.perf_counter()
                    results = self.reward.score(score_items(prompt, group.completions, group.request_id))
                    scored = ScoredGroup(seq, prompt, group.completions, results, gen_s, time.perf_counter() - t0,
                                         replica=rollout.address)
                    with self._cond:
                        heapq.heappush(self._buffer, (scored.version, scored.seq, scored))
                        self._cond.notify_all()
                    started = time.perf_counter()
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the training loop, which reports it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def buffered(self) -> int:
        """Scored groups waiting to be trained."""
        with self._cond:
            return len(self._buffer)

    # ---- training side ------------------------------------------------------------------------
    def _take_batch(self, train_version: int) -> tuple[list[ScoredGroup], int, int]:
        """Waits for B fresh groups; stale ones, and (dynamic sampling) groups whose rewards are all
        equal, are dropped and their admission slots given back, so generation makes up for them."""
        batch: list[ScoredGroup] = []
        dropped = filtered = 0
        filter_limit = self.samples.filter_limit(self.B)
        with self._cond:
            while len(batch) < self.B:
                if self._error is not None:
                    raise self._error
                if self.stop.is_set():
                    raise Stopped("stopping")
                if not self._buffer:
                    self._cond.wait(0.5)
                    continue
                _, _, group = heapq.heappop(self._buffer)
                usable = len(group.scored()) >= 2
                if not (self.gate.is_fresh(group.version, train_version) and usable):
                    dropped += 1
                elif not self.samples.keep(group):
                    filtered += 1
                    if filter_limit is not None and filtered > filter_limit:
                        raise RlfleetError(f"dynamic sampling dropped {filtered} groups with equal rewards in one "
                                           "step; the task is solved or unsolvable for this policy "
                                           "(raise algorithm.max_gen_batches, 0 never gives up)")
                else:
                    batch.append(group)
                    continue
                self._admitted -= 1
                self._cond.notify_all()
        return batch, dropped, filtered

    def run(self) -> dict[str, Any]:
        cc = self.cfg.controller
        self.sync.open()
        self.sync.sync(0)  # both sides loaded the same files; this proves the path before training
        if self.evaluator is not None and self.evaluator.before_train:  # the initial policy, as step 0
            self.writer.log_metrics({"step": 0, "policy_version": 0, **self.evaluator.run(
                0, 0, self.rollout.generate, self.reward.score)})
        gen_threads = [threading.Thread(target=self._generate_forever, args=(r,), name=f"generation-{i}", daemon=True)
                       for i, r in enumerate(self.rollouts)]
        for thread in gen_threads:
            thread.start()
        version = 0
        try:
            for step in range(1, cc.max_steps + 1):
                structlog.contextvars.bind_contextvars(step=step, policy_version=version)
                step_start = time.perf_counter()
                groups, dropped, filtered = self._take_batch(version)
                wait_s = time.perf_counter() - step_start
                samples, sample_metrics = self.samples.build(groups)
                t0 = time.perf_counter()
                result = self.learner.train(TrainBatch(step=step, samples=samples,
                                                       temperature=self.params.temperature or 1.0,
                                                       expected_version=version))
                train_s = time.perf_counter() - t0
                sync_s = self.sync.sync(result.policy_version)
                with self._cond:
                    self._rollout_version = result.policy_version
                    self._cond.notify_all()
                metrics = step_metrics(step, version, groups, samples, result.metrics, dropped=dropped,
                                       wait_s=wait_s, train_s=train_s, sync_s=sync_s,
                                       step_s=time.perf_counter() - step_start)
                metrics.update(sample_metrics, **{"dynamic_sampling/filtered_groups": float(filtered)})
                metrics.update(reward_metrics(self.reward, groups))  # reward/<source>/… under reward.sources
                if self.evaluator is not None:
                    metrics.update(self.evaluator.maybe_run(step, result.policy_version, self.rollout.generate,
                                                            self.reward.score))
                self.writer.log_metrics(metrics)
                self.writer.log_samples(self._sample_records(step, version, groups))
                self.last_metrics, self.step = metrics, step
                version = result.policy_version
                if self.cfg.learner.checkpoint_every and step % self.cfg.learner.checkpoint_every == 0:
                    self.learner.save_checkpoint(step)
                if self.on_step is not None:
                    self.on_step(metrics)
            self.learner.save_checkpoint(cc.max_steps)
        finally:
            self.stop.set()
            for thread in gen_threads:
                thread.join(timeout=5)
            self.sync.close()
        return self.last_metrics

    def _sample_records(self, step: int, train_version: int, groups: list[ScoredGroup]) -> list[dict]:
        limit = self.cfg.controller.samples_per_step
        records = []
        for g in groups:
            for c, r in zip(g.completions, g.results):
                records.append({"step": step, "prompt_index": g.prompt.index, "prompt": g.prompt.text,
                                "response": c.text, "reward": r.score if r.ok else None,
                                "reward_error": r.error or None, "version": c.policy_version,
                                "trained_version": train_version, "replica": g.replica,
                                "last_version": max(c.last_policy_version, c.policy_version), "finish_reason": c.finish_reason,
                                "ground_truth": g.prompt.ground_truth})
        return records if limit is None else records[:limit]
