"""The asynchronous GRPO loop with bounded staleness.

A generation task per member of the rollout fleet, all on one event loop (controller/generation.py;
members join and leave while it runs: controller/fleet.py) keeps it busy with new groups as long as
the staleness gate admits them (and no reward outage pauses admission) and hands
each finished group to scoring on the same loop (controller/scoring.py: Score
over grpc.aio, so a slow or unreachable reward never stalls a rollout stream),
which buffers it; the training loop takes `prompts_per_step` groups (oldest version first), trains,
and pushes the new weights. With `max_staleness=0` the gate admits a step's
groups only after the weights they will be trained against are served, which
is synchronous on-policy GRPO.
"""
from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import structlog

from rlfleet.config import JobConfig
from rlfleet.data.prompts import PromptSource
from rlfleet.errors import RlfleetError
from rlfleet.types import DataRow, SamplingParams
from controller.clients import LearnerClient, RewardClient, RolloutClient
from controller.env_failures import EnvFailures
from controller.env_outage import env_outage_of
from controller.episodes import env_metrics
from controller.evaluation import PeriodicEval
from controller.fleet import Fleet
from controller.admission import AdmissionQueue
from controller.batch_side import BatchSide
from controller.generation import GenerationSide
from controller.groups import ScoredGroup
from rlfleet.data.prompts import Prompt
from controller.journal import Journal
from controller.outputs import RunWriter
from controller.payload_loss import lost_groups
from controller.payload_release import payload_releaser
from controller.recovery import Recovery
from controller.sample_builder import SampleBuilder
from controller.sample_lines import step_lines
from controller.sample_quota import SampleQuota
from controller.scoring import ScoredGroupInput, ScoringSide
from controller.stall import StallWatchdog
from controller.staleness import StalenessGate
from controller.state import ControllerState, Dispatch, save_state, source_state
from controller.stream_loop import StreamLoop
from controller.step_metrics import step_metrics
from controller.train_parts import assemble_batch
from controller.weight_sync import WeightSync

log = structlog.get_logger(__name__)


class GRPOLoop(GenerationSide, ScoringSide, BatchSide):
    def __init__(self, cfg: JobConfig, source: PromptSource, rollout: RolloutClient | list[RolloutClient],
                 reward: RewardClient,
                 learner: LearnerClient, writer: RunWriter, stop: threading.Event | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None,
                 evaluator: PeriodicEval | None = None, journal: Journal | None = None,
                 resume: ControllerState | None = None, fleet: Fleet | None = None):
        self.cfg = cfg
        self.source = source
        # Every member of the fleet has a generation task that asks for work when it is free, which
        # spreads groups by load; all of them take each new version in one broadcast. Members join
        # and leave while the run goes on (controller/fleet.py).
        self.rollouts = rollout if isinstance(rollout, list) else [r for r in (rollout,) if r is not None]
        self.fleet = fleet if fleet is not None else Fleet(self.rollouts, note=self._note)
        self.fleet.on_live = self._start_generation
        self.fleet.on_change = self._fleet_changed
        self._streams = StreamLoop()  # the members' generation tasks, on one event loop
        self._empty_since: float | None = None  # since when no replica is live (bounded wait)
        self.rollout = self.rollouts[0] if self.rollouts else None  # the fleet may start empty
        self.reward, self.learner = reward, learner
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
        self.sync = WeightSync(learner, self.rollouts, cfg.learner.weight_sync_timeout_s,
                               cfg.learner.verify_weights)
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # the training thread and recovery wait on it
        # The generation tasks wait in a queue of their own (same lock), each woken only when work is
        # handed to it (controller/admission.py, issue 44).
        self._admission: AdmissionQueue[Dispatch] = AdmissionQueue(self._streams.wake)
        self._buffer: list[tuple[int, int, ScoredGroup]] = []  # heap by (version, seq)
        self._admitted = 0  # groups admitted that will still be consumed (dropped ones are given back)
        self._seq = 0
        self._rollout_version = 0
        self._error: BaseException | None = None
        self.last_metrics: dict[str, Any] = {}
        self.step = 0
        # Checkpoint/resume and fault tolerance (controller/state.py, controller/recovery.py):
        self.journal = journal  # <run_dir>/journal/prompts.jsonl, every prompt's lifecycle
        self._live: dict[int, Dispatch] = {}  # admitted prompts not yet trained or dropped, by seq
        self._requeue: deque[Dispatch] = deque()  # dispatched again before new prompts
        self._seeded = cfg.controller.max_staleness == 0  # synchronous runs sample reproducibly
        self.recovery = Recovery(self, cfg.controller.service_wait_s, cfg.reward.max_outage_s)
        # data_plane=flight: the learner's staging store, where replicas push groups (refreshed whenever
        # the learner's version is checked: a restarted learner stages at another port)
        self.payload_sink = ""
        self.releaser = payload_releaser(cfg, lambda: self.payload_sink)  # dropped groups: replicas, sink
        # Generated groups waiting for their rewards; at most the admitted groups (the gate's bound).
        self._to_score: deque[ScoredGroupInput] = deque()
        # Received groups and their `generated` lines, handed over once per turn of the event loop
        # (ScoringSide._hand_to_scoring); touched only on the event loop.
        self._arrived: list[tuple[dict[str, Any], ScoredGroupInput]] = []
        self._scoring = 0  # groups being scored now
        self._score_calls = 0  # Score calls in flight (on the event loop)
        self._score_slots = 1  # members the run has had: Score calls at once (MAX_SCORE_CALLS at most)
        self._failed = Counter()  # since the last step: failed reward items, groups with no reward at all
        self._env_failed: Counter[str] = Counter()  # since the last step: failed episodes by cause
        self._failed_kept = 0  # failed episodes of dropped groups written to the samples this step
        # No step for controller.max_stall_s: the run stops naming why (controller/stall.py), fed by the
        # counters above and the groups dropped since the last step, by reason, and their samples.
        self.stall = StallWatchdog(cfg.controller.max_stall_s)
        self._dropped_since_step: Counter[str] = Counter()
        self._dropped_samples = 0  # samples of the groups dropped since the last step
        self._dropped_quota = SampleQuota()  # dropped samples written to samples/, a bounded rate
        self.env_outage = env_outage_of(cfg, self._note)  # None without an environment server
        self.env_failures = (EnvFailures(cfg.env.address or cfg.env.name or "",
                                         cfg.env.max_consecutive_failures) if cfg.env.enabled else None)
        self._start_step, self._start_version = 0, 0
        # the newest step with a checkpoint: where controller.resume=latest goes back to
        self.checkpointed_step = 0
        if resume is not None:
            self._restore(resume)

    def _restore(self, state: ControllerState) -> None:
        """Continues after the checkpoint of `state.step`: its prompts not yet trained go first."""
        self._start_step, self._start_version = state.step, state.policy_version
        self.checkpointed_step = state.step
        self.step, self._seq, self._rollout_version = state.step, state.seq, state.policy_version
        for dispatch in state.dispatches(self.source.prompts):
            self._requeue.append(dispatch)
            for seq, prompt in dispatch.members:
                self._live[seq] = dispatch
        # Admitted = trained (B per step) + not yet trained; the gate goes on from there.
        self._admitted = state.step * self.B + len(self._live)
        self._note("resumed", step=state.step, version=state.policy_version, requeued=len(self._live))

    def _note(self, event: str, **fields: Any) -> None:
        if getattr(self, "journal", None) is not None:
            self.journal.record(event, **fields)

    def _note_all(self, event: str, rows: list[dict[str, Any]]) -> None:
        """A journal line per row, in one write (Journal.record_all)."""
        if getattr(self, "journal", None) is not None:
            self.journal.record_all(event, rows)

    def _wake(self) -> None:
        """Something admission or the training side waits on changed: work goes to the members waiting
        for it (only they wake), and the threads waiting on the condition re-check."""
        with self._cond:
            self._hand_out()
            self._cond.notify_all()

    def _fleet_changed(self) -> None:
        """A member joined, left or is leaving: as _wake, and the waiting members that take no more
        work stop waiting."""
        with self._cond:
            self._hand_out(sweep=True)
            self._cond.notify_all()

    def snapshot(self, step: int, version: int) -> ControllerState:
        """The controller's state right now, for the checkpoint of `step`."""
        with self._cond:
            dispatches: dict[int, Dispatch] = {}
            for seq in sorted(self._live):
                dispatches.setdefault(id(self._live[seq]), self._live[seq])
            requeue = [{"seed": d.seed, "members": [[seq, p.index] for seq, p in d.members
                                                    if seq in self._live]}
                       for d in dispatches.values()]
            return ControllerState(step, version, self._seq, source_state(self.source), requeue)

    # ---- training side ------------------------------------------------------------------------
    def _checkpoint(self, step: int, version: int) -> None:
        """The learner's checkpoint of `step`, then the controller's state of the same step."""
        self.recovery.call_learner(lambda: self.learner.save_checkpoint(step), version)
        save_state(self.writer.run_dir, self.snapshot(step, version))
        self.checkpointed_step = step

    def _checkpoint_on_stop(self, version: int) -> None:
        """A stopped run (Ctrl-C, SIGTERM, a stall, an outage: any RlfleetError that ends the loop)
        keeps its progress: the last finished step is checkpointed unless it already is, so
        controller.resume=latest continues from it whatever learner.checkpoint_every is. Once, with
        no retries: the learner may be the reason the run stops. Skipped when the learner does not
        hold this step's version (the stop came between a step's Train and its bookkeeping, or the
        learner restarted)."""
        step = self.step
        if step <= self.checkpointed_step:
            return
        try:
            status = self.learner.status()
            if not status.ready or status.policy_version != version:
                log.warning("stopped; no checkpoint of the last step: the learner does not hold its version",
                            step=step, version=version, learner_version=status.policy_version)
                return
            self.learner.save_checkpoint(step)
        except RlfleetError as exc:
            log.warning("stopped; could not checkpoint the last step", step=step, error=str(exc)[:300])
            return
        save_state(self.writer.run_dir, self.snapshot(step, version))
        self.checkpointed_step = step
        self._note("checkpointed_on_stop", step=step, version=version)
        # the step and version it is about, not those bound for the step that was in progress
        log.warning(f"stopped after step {step}; checkpoint written: controller.resume=latest "
                    "continues from it", step=step, policy_version=version)

    def run(self) -> dict[str, Any]:
        cc = self.cfg.controller
        if self.releaser is not None:
            self.payload_sink = self.learner.status().payload_sink
        if self.fleet.members():
            # The group is formed over these members and only they are committed: a replica accepted
            # meanwhile stays joining, and the next boundary re-forms the group with it.
            members = self.fleet.weight_members()
            self.sync.rollouts = [m.client for m in members]
            self.sync.open()
            # Both sides loaded the same files (or the learner its checkpoint, which this pushes).
            self.sync.sync(self._start_version)
            self.fleet.commit(members, self._start_version)  # the initial group
        else:  # replicas join once it runs (deploy/compose.yaml): the first one forms the group
            self._await_first_member()  # commits the members it formed the group over
        # initial policy
        if self.evaluator is not None and self.evaluator.before_train and not self._start_step:
            self.writer.log_metrics({"step": 0, "policy_version": 0, **self.evaluator.run(
                0, 0, self._generate_for_eval, self.recovery.score)})
            self.writer.log_texts(0, self.evaluator.texts)
        for member in self.fleet.members():
            if member.takes_work():  # a joiner starts once a re-formed group made it live (fleet.on_live)
                self._start_generation(member)
        self.fleet.watch(self.stop)  # joined members that stop answering leave within seconds
        version = self._start_version
        self.stall.restart()  # training starts now: the initial sync and evaluation are not a stall
        try:
            for step in range(self._start_step + 1, cc.max_steps + 1):
                structlog.contextvars.bind_contextvars(step=step, policy_version=version)
                step_start = time.perf_counter()
                groups, dropped = self._take_batch(version)
                wait_s = time.perf_counter() - step_start
                t0 = time.perf_counter()
                while True:
                    batch, sample_metrics = assemble_batch(self.samples, step, groups,
                                                           self.params.temperature or 1.0, version)
                    samples = batch.samples
                    try:
                        result = self.recovery.train(batch)  # retried only because Train is idempotent
                        break
                    except RlfleetError as exc:  # data_plane=flight: a replica took its groups' tokens along
                        lost = lost_groups(groups, exc)
                        if not lost:
                            raise
                        groups, more = self._retake_batch(groups, lost, version, exc)
                        dropped.update(more)
                self.recovery.last_batch = batch  # replayed if the learner restarts before its checkpoint
                train_s = time.perf_counter() - t0
                with self._cond:
                    for g in groups:
                        self._live.pop(g.seq, None)
                self._note_all("trained", [{"seq": g.seq, "step": step, "version": version,
                                            "generation_version": g.version} for g in groups])
                sync_s = self.recovery.sync(result.policy_version)
                with self._cond:
                    self._rollout_version = result.policy_version
                    self._wake()
                metrics = step_metrics(step, version, groups, samples, result.metrics, dropped=dropped,
                                       wait_s=wait_s, train_s=train_s, sync_s=sync_s,
                                       step_s=time.perf_counter() - step_start)
                metrics.update(sample_metrics,
                               **{"dynamic_sampling/filtered_groups": float(dropped["filtered"])})
                with self._cond:  # the samples of groups dropped since the last step, and the clock again
                    metrics["samples/dropped"] = float(self._dropped_samples)
                    self._dropped_samples = 0
                    self._dropped_since_step.clear()
                    self.stall.trained(metrics["timing/step_s"])
                with self._cond:  # every group scored since the last step, trained or dropped
                    metrics["reward/failed"] = float(self._failed["items"])
                    metrics["reward/failed_groups"] = float(self._failed["groups"])
                    self._failed.clear()
                    if self.cfg.env.enabled:  # env/…: the batch's episodes; failures: all since the last step
                        metrics.update(env_metrics([c for g in groups for c in g.completions]))
                        metrics["env/failed"] = float(sum(self._env_failed.values()))
                        metrics.update({f"env/failed/{cause}": float(n)
                                        for cause, n in self._env_failed.items()})
                        self._env_failed.clear()
                    if self.env_failures is not None:
                        self.env_failures.report()  # the failures of the last minute, if due
                metrics.update(self.reward.step_metrics(groups))  # reward/<source>/… under reward.sources
                metrics.update(self.fleet.metrics())  # fleet/replicas, fleet/joins, fleet/leaves
                if self.evaluator is not None:
                    # Scored as training scores: a reward outage is waited out (recovery.score).
                    metrics.update(self.evaluator.maybe_run(step, result.policy_version,
                                                            self._generate_for_eval,
                                                            self.recovery.score))
                self.writer.log_metrics(metrics)
                if self.evaluator is not None and "timing/eval_s" in metrics:
                    self.writer.log_texts(step, self.evaluator.texts)  # a few of its samples
                # its groups' records, made as they were scored (controller/sample_lines.py)
                self.writer.write_sample_lines(step_lines(step, version, groups,
                                                          self.cfg.controller.samples_per_step))
                self._failed_kept = 0
                self.last_metrics, self.step = metrics, step
                version = result.policy_version
                every = self.cfg.learner.checkpoint_every
                if (every and step % every == 0) or step == cc.max_steps:
                    self._checkpoint(step, version)
                if self.on_step is not None:
                    self.on_step(metrics)
        except RlfleetError:  # Ctrl-C, a stall, an outage, a service gone for good: keep the progress
            self._checkpoint_on_stop(version)
            raise
        finally:
            self.stop.set()
            self._wake()  # the members waiting for work stop waiting
            self.requeue_live_on_stop()
            self._streams.close(then=self._close_streams)  # the Score calls in flight are cancelled
            self.sync.close()
            if self.env_outage is not None:
                self.env_outage.close()
        return self.last_metrics

    def requeue_live_on_stop(self) -> None:
        """The admitted prompts not trained, re-queued in the journal (the last controller state re-queues
        them on resume); no member writes a `dispatched` line after these (_record_dispatch)."""
        with self._cond:
            for seq in sorted(self._live):
                self._note("requeued", seq=seq, reason="stopped")

    def environment_status(self) -> dict[str, Any] | None:
        """The environment server as the controller sees it (`rlfleet status`); None without one."""
        if self.env_failures is None:
            return None
        state, lasted = self.env_outage.status() if self.env_outage is not None else ("running", 0.0)
        return {"address": self.env_failures.address, **self.env_failures.snapshot(), "outage": state,
                "outage_s": lasted}

    def _row(self, prompt: Prompt) -> DataRow | None:
        """The data row an environment starts the prompt's episodes from (None without one)."""
        if not self.cfg.env.enabled:
            return None
        return DataRow(data_source=prompt.data_source, prompt=prompt.text, ground_truth=prompt.ground_truth,
                       extra_info=prompt.extra_info)
