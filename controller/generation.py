"""The generation side of the GRPO loop: a task per member of the rollout fleet, all on one event loop.

Each member's task asks for work when its member is free (which spreads groups by load; admission is a
FIFO hand-off, controller/admission.py), streams the member's groups (grpc.aio) and hands them to
scoring on the same loop (controller/scoring.py: Score over grpc.aio, so a slow or unreachable reward
never stalls a rollout stream), which buffers them for the training side. A member that fails or leaves
hands its prompts not yet returned back to the queue. One event loop rather than a thread per member
(issue 44): at 256 replicas the threads' wake-ups (grpc's sync streams poll ten times a second) were
the controller's own latency.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import structlog

from rlfleet.data.prompts import Prompt
from rlfleet.errors import PeerSilent, RlfleetError, ServiceUnavailable
from rlfleet.types import GroupResult, PromptRequest
from controller.admission import HEAD_POLL_S, IDLE_POLL_S, Waiter
from controller.fleet import LEAVING, Member
from controller.recovery import RETRY_FIRST_S, RETRY_MAX_S, Stopped
from controller.scoring import ScoredGroupInput
from controller.state import Dispatch, sampling_seed
from controller.stream_loop import blocking, settle

log = structlog.get_logger(__name__)


class Leaving(Exception):
    """A member's generation task ends: the member is leaving or left the fleet."""


class GenerationSide:
    """The generation side of GRPOLoop (controller/loop.py): a task per fleet member (on one event
    loop, self._streams) asks for work when the member is free, streams its groups to scoring (on the
    same loop), and hands its prompts back when the member fails or leaves. State lives on the loop."""

    async def _admit(self, member: Member) -> tuple[Dispatch, Waiter[Dispatch]]:
        """Waits in the admission queue (controller/admission.py) until work is handed to `member`, in
        the order the members asked; returns the request and its waiter, which tells how long it was
        held back (the staleness gate, a pause for an outage or a resync): the rest of a free slot's
        wait is the controller's own admission latency (bench/fleetsim/measure.py). Leaving when
        `member` takes no more work."""
        loop = asyncio.get_running_loop()
        with self._cond:
            waiter = self._admission.join(member)
            self._hand_out()
        try:
            while True:
                with self._cond:
                    if waiter.work is not None:
                        return waiter.work, waiter
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

    def _record_dispatch(self, dispatch: Dispatch, replica: str, hold: dict[str, float]) -> None:
        """The dispatch's `dispatched` journal lines (`hold`: how long admission held it back,
        Waiter.hold_fields), unless the run is stopping: under the loop's lock,
        so never after the stop's `requeued` lines for the same prompts (GRPOLoop.requeue_live_on_stop).
        A line written after them left its prompt open and not re-queued in the journal: lost to a
        resume (the fresh-clone suite caught a member preempted between its hand-out and this write)."""
        with self._cond:
            if self.stop.is_set():
                raise Stopped("stopping")  # its prompts are live: the stop re-queued them
            self._note_all("dispatched", [{"seq": seq, "prompt_index": prompt.index,
                                           "version": self._rollout_version, "replica": replica, **hold}
                                          for seq, prompt in dispatch.members])

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
        # a Score call at a time per member (MAX_SCORE_CALLS at most: controller/scoring.py)
        self._score_slots = max(self._score_slots, len(self.fleet.members()))

    async def _generate_forever(self, member: Member) -> None:
        rollout = member.client
        delay = RETRY_FIRST_S  # the wait after a stream that brought nothing back (_short_stream)
        try:
            while not self.stop.is_set():
                dispatch, waiter = await self._admit(member)
                prompts = dispatch.request_ids()
                requests = [PromptRequest(rid, p.prompt_ids, row=self._row(p))
                            for rid, (_, p) in prompts.items()]
                params = self.params if dispatch.seed is None else replace(self.params, seed=dispatch.seed)
                self._record_dispatch(dispatch, rollout.address, waiter.hold_fields())
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
        """The members' and the reward's asyncio channels, closed on the event loop as the run stops."""
        for client in [m.client for m in self.fleet.members()] + [self.reward]:
            if hasattr(client, "close_streams"):
                await client.close_streams()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._wake()

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
