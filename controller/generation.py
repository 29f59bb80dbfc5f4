"""The generation side of the GRPO loop: a task per member of the rollout fleet, all on one event loop.

Each member's task asks for work when its member is free (which spreads groups by load; admission is a
FIFO hand-off, controller/admission.py), streams the member's groups (grpc.aio) to the scoring threads,
which score them off the event loop (a slow or unreachable reward never stalls a rollout stream) and
buffer them for the training side. A member that fails or leaves hands its prompts not yet returned
back to the queue. One event loop rather than a thread per member (issue 44): at 256 replicas the
threads' wake-ups (grpc's sync streams poll ten times a second) were the controller's own latency.
"""
from __future__ import annotations

import asyncio
import heapq
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import structlog

from rlfleet.data.prompts import Prompt
from rlfleet.errors import PeerSilent, RlfleetError, ServiceUnavailable
from rlfleet.types import Completion, GroupResult, PromptRequest
from controller.admission import HEAD_POLL_S, IDLE_POLL_S
from controller.fleet import LEAVING, Member
from controller.episodes import env_unavailable, split_group
from controller.groups import ScoredGroup
from controller.recovery import RETRY_FIRST_S, RETRY_MAX_S, Stopped
from controller.state import Dispatch, sampling_seed
from controller.stream_loop import blocking, settle

log = structlog.get_logger(__name__)


@dataclass
class ScoredGroupInput:
    """A generated group waiting for its rewards."""

    seq: int
    prompt: Prompt
    request_id: str
    completions: list[Completion]
    gen_s: float
    replica: str


class Leaving(Exception):
    """A member's generation task ends: the member is leaving or left the fleet."""


MAX_SCORING_THREADS = 8
# Items that go out in a Score call of their own while another call is in flight (fewer wait for it):
# a step's worth at 32 prompts x 8 samples. Below it a call's fixed cost (gRPC, request id, deadline)
# dominates; above it a slow reward service gets calls in parallel, as before natural batching.
SCORE_BATCH_ITEMS = 256


class GenerationSide:
    """The generation side of GRPOLoop (controller/loop.py): a task per fleet member (on one event
    loop, self._streams) asks for work when the member is free, streams its groups to the scoring
    threads, and hands its prompts back when the member fails or leaves. State lives on the loop."""

    async def _admit(self, member: Member) -> tuple[Dispatch, float]:
        """Waits in the admission queue (controller/admission.py) until work is handed to `member`, in
        the order the members asked; returns the request and the seconds it was held back (the
        staleness gate, a pause for an outage or a resync): the rest of a free slot's wait is the
        controller's own admission latency (bench/fleetsim/measure.py). Leaving when `member` takes no
        more work."""
        loop = asyncio.get_running_loop()
        with self._cond:
            waiter = self._admission.join(member)
            self._hand_out()
        try:
            while True:
                with self._cond:
                    if waiter.work is not None:
                        return waiter.work, waiter.held_s()
                    if self.stop.is_set():
                        raise Stopped("stopping")
                    if not member.takes_work():
                        raise Leaving(member.address)
                    self._admission.rejoin(waiter)  # woken without work, yet it still waits
                    first = self._admission.is_first(waiter)
                    waiter.signal = woken = loop.create_future()  # settled by the hand-out or the poll
                poll = loop.call_later(HEAD_POLL_S if first else IDLE_POLL_S, settle, woken)
                try:
                    await woken
                finally:
                    poll.cancel()
                with self._cond:
                    if waiter.work is None and self._admission.is_first(waiter):
                        self._hand_out()  # its poll: what changed without a notify (an outage's trial)
        finally:
            with self._cond:
                self._admission.leave(waiter)

    def _hand_out(self, sweep: bool = False) -> None:
        """Hands work to the waiting members while admission allows (the loop's lock held): called by
        whoever changed what admission allows, so that only the members given work wake up. `sweep`:
        the fleet changed, every waiting member that takes no more work is woken to leave."""
        if self.stop.is_set():
            self._admission.dismiss_all()
            return
        self._admission.hand_out(self._next_work, Member.takes_work, sweep)

    def _next_work(self) -> Dispatch | None:
        """The next request the gate admits (a re-queued one first), or None while it admits none."""
        paused = (self.recovery.resync_pending() or self.recovery.reward_outage.blocked()
                  or (self.env_outage is not None and self.env_outage.blocked()))
        if paused:
            return None
        if self._requeue:
            return self._requeue.popleft() if self._env_admits() else None  # its slots are counted
        limit = self.gate.admission_limit(self._rollout_version)
        if self._admitted >= limit or not self._env_admits():
            return None
        count = min(self.cfg.controller.prompts_per_request, limit - self._admitted)
        self._admitted += count
        dispatch = Dispatch(sampling_seed(self.cfg.run.seed, self._seq) if self._seeded else None)
        for _ in range(count):
            dispatch.members.append((self._seq, self.source.next()))
            self._live[self._seq] = dispatch
            self._seq += 1
        return dispatch

    def _env_admits(self) -> bool:
        """Whether the environment outage lets this request go (one request a trial: env_outage.py)."""
        return self.env_outage is None or self.env_outage.take_admission()

    def _await_first_member(self) -> None:
        wait_s = max(self.cfg.controller.connect_timeout_s, self.cfg.controller.service_wait_s)
        log.warning("no rollout replica yet; waiting for one to join", wait_s=wait_s)
        deadline = time.monotonic() + wait_s
        while not self.fleet.members():
            if self.stop.wait(0.5):
                raise Stopped("stopping")
            if time.monotonic() > deadline:
                raise ServiceUnavailable(f"no rollout replica joined within {wait_s:g}s "
                                         "(controller.connect_timeout_s, controller.service_wait_s): start "
                                         "them with `rlfleet serve rollout --join CONTROLLER_HOST:PORT`")
        self.recovery.resync(self._start_version)

    def _start_generation(self, member: Member) -> None:
        if member.generating:
            return
        member.generating = True
        self._streams.submit(self._generate_forever(member))
        scorers = sum(t.name.startswith("scoring-") for t in self._threads)
        if scorers < min(MAX_SCORING_THREADS, len(self.fleet.members())):
            self._start_scoring(scorers)

    def _start_scoring(self, index: int) -> None:
        thread = threading.Thread(target=self._score_forever, name=f"scoring-{index}", daemon=True)
        self._threads.append(thread)
        thread.start()

    async def _generate_forever(self, member: Member) -> None:
        rollout = member.client
        delay = RETRY_FIRST_S  # the wait after a stream that brought nothing back (_short_stream)
        try:
            while not self.stop.is_set():
                dispatch, held_s = await self._admit(member)
                prompts = dispatch.request_ids()
                requests = [PromptRequest(rid, p.prompt_ids, row=self._row(p))
                            for rid, (_, p) in prompts.items()]
                params = self.params if dispatch.seed is None else replace(self.params, seed=dispatch.seed)
                self._note_all("dispatched", [{"seq": seq, "prompt_index": prompt.index,
                                               "version": self._rollout_version, "replica": rollout.address,
                                               "held_s": round(held_s, 4)}
                                              for seq, prompt in dispatch.members])
                started = time.perf_counter()
                pending = dict(prompts)
                try:
                    async for group in self._stream(rollout, requests, params):
                        seq, prompt = pending.pop(group.request_id)
                        self.fleet.heard_from(member)
                        member.groups += 1
                        member.finished += member.state == LEAVING
                        now = time.perf_counter()
                        self._hand_to_scoring(
                            {"seq": seq, "version": min(c.policy_version for c in group.completions),
                             "replica": rollout.address},
                            ScoredGroupInput(seq, prompt, group.request_id, group.completions, now - started,
                                             rollout.address))
                        started = now
                    if pending:  # the stream ended OK but short: its missing prompts go to the next request
                        delay = await self._short_stream(member, dispatch, pending, len(prompts), delay)
                    else:
                        delay = RETRY_FIRST_S
                except ServiceUnavailable as exc:  # the replica died or stalled: its prompts go to another
                    if self.stop.is_set():  # the stream was cut by the loop's own exit
                        return
                    if member.joined or not member.takes_work():  # an elastic member leaves instead
                        member.handed_back += await blocking(self.recovery.requeue, rollout, dispatch,
                                                             pending, "replica_left", exc)
                        if member.state != LEAVING:  # it stopped answering (its pings), or broke
                            silent = isinstance(exc, PeerSilent)
                            await blocking(self.fleet.remove, member, "unreachable" if silent else "failed")
                        return
                    if not await blocking(self.recovery.rollout_failed, rollout, dispatch, pending, exc,
                                          gone=member.gone.is_set):
                        return  # it rejoined after a restart: its new member's task takes over
        except (Stopped, Leaving, asyncio.CancelledError):  # cancelled: the run stops (StreamLoop.close)
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the training loop, which reports it
            self._fail(exc)
        finally:
            self.fleet.generation_ended(member)

    def _hand_to_scoring(self, generated: dict, waiting: ScoredGroupInput) -> None:
        """Queues a received group for the scoring threads. The groups that arrive in one turn of the
        event loop (from any member) go together, on the loop's next turn: their `generated` journal
        lines in one write and the groups to the scoring threads under one lock, one wake-up (a write
        and a lock a group were a third of the loop's own time after the conversions, issue 44). The
        lines come before the groups are scored, as before; a stop drops what is queued, as it drops
        what the streams still carry (the journal re-queues every admitted prompt not trained)."""
        self._arrived.append((generated, waiting))
        if len(self._arrived) == 1:
            asyncio.get_running_loop().call_soon(self._hand_over_arrived)

    def _hand_over_arrived(self) -> None:
        arrived, self._arrived = self._arrived, []
        try:
            self._note_all("generated", [generated for generated, _ in arrived])
        except BaseException as exc:  # noqa: BLE001 - a callback's error would only be logged by asyncio
            self._fail(exc)  # the training loop reports it and stops, as from a generation task
            return
        items = sum(len(waiting.completions) for _, waiting in arrived)
        with self._cond:
            self._to_score.extend(waiting for _, waiting in arrived)
            # a scoring thread takes all that one Score call may carry: as many woken as calls needed
            self._scorable.notify(-(-items // max(1, self.cfg.limits.max_score_items)))

    async def _stream(self, rollout, requests: list[PromptRequest], params) -> AsyncIterator[GroupResult]:
        """The member's Generate stream on the event loop; a client with only a blocking generate()
        (an in-process fake in the unit tests) is read on a worker thread, a group at a time."""
        if hasattr(rollout, "generate_async"):
            async for group in rollout.generate_async(requests, params, self.payload_sink):
                yield group
            return
        groups = iter(rollout.generate(requests, params, self.payload_sink))
        end = object()
        loop = asyncio.get_running_loop()
        while (group := await loop.run_in_executor(None, next, groups, end)) is not end:
            yield group

    async def _short_stream(self, member: Member, dispatch: Dispatch, pending: dict[str, tuple[int, Prompt]],
                            asked: int, delay: float) -> float:
        """A Generate stream ended without an error but without some of its groups (a replica whose
        engine stopped mid-request, a third-party rollout): the missing prompts are re-queued at once
        (journal `requeued`, reason `stream_ended_short`), as for a failed stream. Before, they stayed
        admitted and in flight until the run stopped, holding admission slots (issue 42). A stream that
        brought nothing back is followed by a wait (doubling, RETRY_MAX_S at most) before the member
        asks for work again, so a replica that always answers empty cannot spin. Returns that wait."""
        missing = len(pending)
        error = RlfleetError(f"rollout replica {member.address}: the Generate stream ended OK with "
                             f"{missing} of {asked} groups missing")
        handed = await blocking(self.recovery.requeue, member.client, dispatch, pending,
                                "stream_ended_short", error)
        if member.state == LEAVING:  # counted as handed back in its `left` journal line
            member.handed_back += handed
        if missing < asked:
            return RETRY_FIRST_S
        await asyncio.sleep(delay)  # cancelled if the run stops meanwhile (StreamLoop.close)
        if self.stop.is_set():
            raise Stopped("stopping")
        return min(delay * 2, RETRY_MAX_S)

    async def _close_streams(self) -> None:
        """The members' asyncio channels, closed on the event loop as the run stops."""
        for member in self.fleet.members():
            if hasattr(member.client, "close_streams"):
                await member.client.close_streams()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._wake()

    def _score_forever(self) -> None:
        """Scores the generated groups waiting, all of them in one Score call (up to
        limits.max_score_items): a Generate that returns a step's groups at once costs one reward
        round trip, not one per group. Batching is natural: while a call is in flight, groups that
        arrive wait for it to return and then go out together (_score_ready), so a Score call's gRPC
        cost is paid per batch, not per group; a backlog of a full batch goes out at once on another
        thread, so a slow reward service is still asked up to MAX_SCORING_THREADS calls at a time.
        A group whose scoring waits out a reward outage stays counted as admitted, and is buffered
        once scored (or the run stops)."""
        limit = self.cfg.limits.max_score_items
        try:
            while True:
                with self._cond:
                    while not self._score_ready(min(limit, SCORE_BATCH_ITEMS)):
                        if self.stop.is_set() and not self._to_score:
                            return
                        self._scorable.wait(0.5)
                    batch = [self._to_score.popleft()]
                    size = len(batch[0].completions)
                    while self._to_score and size + len(self._to_score[0].completions) <= limit:
                        batch.append(self._to_score.popleft())
                        size += len(batch[-1].completions)
                    self._scoring += len(batch)
                    if self._score_ready(min(limit, SCORE_BATCH_ITEMS)):
                        self._scorable.notify()  # a full batch still waits: another thread takes it
                try:
                    self._score_batch(batch)
                finally:
                    with self._cond:
                        self._scoring -= len(batch)
                        if self._to_score:
                            self._scorable.notify()  # what gathered meanwhile goes out now
                        self._wake()  # the training thread; a reward back lets admission go on
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the training loop, which reports it
            if not self.stop.is_set():
                self._fail(exc)

    def _score_ready(self, batch_items: int) -> bool:
        """Whether a scoring thread should take the waiting groups now (the loop's lock held): when no
        call is in flight, when `batch_items` items (or more) wait, or when the run stops; otherwise
        they gather until the call in flight returns."""
        if not self._to_score:
            return False
        if not self._scoring or self.stop.is_set():
            return True
        waiting = 0
        for group in self._to_score:  # stops at a batch: at most batch_items / n groups looked at
            waiting += len(group.completions)
            if waiting >= batch_items:
                return True
        return False

    def _score_batch(self, batch: list[ScoredGroupInput]) -> None:
        for waiting in batch:
            if self.env_outage is not None:
                unreachable = env_unavailable(waiting.completions)
                if unreachable is not None:
                    self.env_outage.failed(unreachable)
                elif any(not c.failed for c in waiting.completions):
                    self.env_outage.reached()
            if self.env_failures is not None:  # stops the run when every episode fails (EnvironmentFailing)
                self.env_failures.add(waiting.completions)
        # Episodes with the environment's reward (or failed) skip the reward service.
        split = [split_group(w.prompt, w.completions, w.request_id) for w in batch]
        items = [item for _, to_score in split for item in to_score]
        t0 = time.perf_counter()
        scored_items = iter(self.recovery.score(items) if items else [])
        elapsed = time.perf_counter() - t0
        scored_groups = []
        for waiting, (fixed, to_score) in zip(batch, split):
            results = [r if r is not None else next(scored_items) for r in fixed]
            # The call's time shared by item count, so timing/reward_s (a sum over groups) stays the
            # time spent scoring.
            scored_groups.append(ScoredGroup(waiting.seq, waiting.prompt, waiting.completions, results,
                                             waiting.gen_s, elapsed * len(to_score) / max(1, len(items)),
                                             replica=waiting.replica))
        # The batch's `scored` lines in one write (a line a group, as before: issue 44), before any of
        # its groups can be trained; then all of them buffered under one hold of the lock
        self._note_all("scored", [{"seq": g.seq, "failed": g.failed} for g in scored_groups])
        with self._cond:
            for scored in scored_groups:
                env_failed = sum(c.failed for c in scored.completions)
                self._failed["items"] += scored.failed - env_failed
                self._failed["groups"] += bool(scored.results) and scored.failed == len(scored.results)
                if env_failed:
                    self._env_failed.update(c.env_failure for c in scored.completions if c.failed)
                heapq.heappush(self._buffer, (scored.version, scored.seq, scored))

    def buffered(self) -> int:
        """Scored groups waiting to be trained."""
        with self._cond:
            return len(self._buffer)

    def _check_fleet_not_empty(self) -> None:
        """With no replica live (all left), the run waits for one to join, controller.service_wait_s
        at most."""
        if self.fleet.members():
            self._empty_since = None
            return
        now = time.monotonic()
        if self._empty_since is None:
            self._empty_since = now
            log.warning("no rollout replica left in the fleet; waiting for one to join",
                        wait_s=self.cfg.controller.service_wait_s)
        elif now - self._empty_since > self.cfg.controller.service_wait_s:
            raise ServiceUnavailable(f"no rollout replica in the fleet for controller.service_wait_s="
                                     f"{self.cfg.controller.service_wait_s:g}s: add one with "
                                     "`rlfleet serve rollout --join CONTROLLER_HOST:PORT`")

    def _generate_for_eval(self, prompts, params):
        """Evaluation generates on a live member (the first replica may have left)."""
        live = [m for m in self.fleet.live() if m.takes_work()] or self.fleet.live()
        if not live:
            raise ServiceUnavailable("no rollout replica in the fleet to evaluate with")
        return live[0].client.generate(prompts, params)
