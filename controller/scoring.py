"""The scoring side of the GRPO loop: generated groups get their rewards on the event loop where they
arrive (controller/stream_loop.py), over grpc.aio (RewardClient.score_async), and are buffered for
the training side.

Before, scoring threads took the groups from the event loop and made blocking Score calls: at 64
replicas the calls and the hand-offs between the loop and those threads (a notify per arrival, a wait
per call, a notify_all per return) were a fifth of the controller's GIL time (issue 44). On the loop a
Score call in flight costs nothing until its reply comes, and the groups that arrive meanwhile need
no wake-up. What may wait long (a reward outage) waits in the loop's own sleeps, never blocking it.
"""
from __future__ import annotations

import asyncio
import heapq
import time
from dataclasses import dataclass

from rlfleet.data.prompts import Prompt
from rlfleet.types import Completion, ScoreItem, ScoreResult
from controller.episodes import env_unavailable, split_group
from controller.groups import ScoredGroup
from controller.recovery import Stopped
from controller.sample_lines import group_pieces
from controller.stream_loop import blocking
from controller.train_parts import prepare_for_training


@dataclass
class ScoredGroupInput:
    """A generated group waiting for its rewards."""

    seq: int
    prompt: Prompt
    request_id: str
    completions: list[Completion]
    gen_s: float
    replica: str


# Score calls in flight at most (fewer with fewer replicas: ScoringSide._score_calls_allowed): a slow
# reward service is asked this many calls at a time, as it was by as many scoring threads.
MAX_SCORE_CALLS = 8
# Items that go out in a Score call of their own while another call is in flight (fewer wait for it):
# a step's worth at 32 prompts x 8 samples. Below it a call's fixed cost (gRPC, request id, deadline)
# dominates; above it a slow reward service gets calls in parallel, as before natural batching.
SCORE_BATCH_ITEMS = 256


class ScoringSide:
    """The scoring side of GRPOLoop (controller/loop.py): on the generation side's event loop, the
    groups that arrive are journalled (`generated`), batched into Score calls and, once scored,
    journalled (`scored`) and buffered for the training thread."""

    def _hand_to_scoring(self, generated: dict, waiting: ScoredGroupInput) -> None:
        """Queues a received group for scoring. The groups that arrive in one turn of the event loop
        (from any member) go together, on the loop's next turn: their `generated` journal lines in one
        write (a write a group was a third of the loop's own time after the conversions, issue 44),
        then to scoring. The lines come before the groups are scored; a stop drops what is queued, as
        it drops what the streams still carry (the journal re-queues every admitted prompt not trained)."""
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
        with self._cond:
            self._to_score.extend(waiting for _, waiting in arrived)
        self._send_to_scoring()

    def _score_calls_allowed(self) -> int:
        """A call at a time per replica the run has had, MAX_SCORE_CALLS at most (as many as there
        were scoring threads, one started with each member up to that bound)."""
        return max(1, min(MAX_SCORE_CALLS, self._score_slots))

    def _send_to_scoring(self) -> None:
        """Sends the waiting groups to the reward service (on the event loop), all that one Score call
        may carry (limits.max_score_items) in a call: a Generate that returns a step's groups at once
        costs one reward round trip, not one per group. Batching is natural: while a call is in
        flight, groups that arrive wait for it to return and then go out together (_score_ready); a
        backlog of a full batch goes out at once in another call, so a slow reward service is still
        asked up to MAX_SCORE_CALLS calls at a time. Nothing new goes out once the run stops."""
        limit = self.cfg.limits.max_score_items
        batches = []
        with self._cond:
            while (not self.stop.is_set() and self._score_calls < self._score_calls_allowed()
                   and self._score_ready(min(limit, SCORE_BATCH_ITEMS))):
                batch = [self._to_score.popleft()]
                size = len(batch[0].completions)
                while self._to_score and size + len(self._to_score[0].completions) <= limit:
                    batch.append(self._to_score.popleft())
                    size += len(batch[-1].completions)
                self._scoring += len(batch)
                self._score_calls += 1
                batches.append(batch)
        for batch in batches:
            self._streams.spawn(self._score(batch))

    def _score_ready(self, batch_items: int) -> bool:
        """Whether the waiting groups should go out now (the loop's lock held): when no call is in
        flight, or when `batch_items` items (or more) wait; otherwise they gather until the call in
        flight returns."""
        if not self._to_score:
            return False
        if not self._scoring:
            return True
        waiting = 0
        for group in self._to_score:  # stops at a batch: at most batch_items / n groups looked at
            waiting += len(group.completions)
            if waiting >= batch_items:
                return True
        return False

    async def _score(self, batch: list[ScoredGroupInput]) -> None:
        """Scores `batch` and buffers it. A group whose scoring waits out a reward outage stays
        counted as admitted, and is buffered once scored (or the run stops: the task is cancelled)."""
        try:
            await self._score_batch(batch)
        except Stopped:
            pass
        except Exception as exc:  # noqa: BLE001 - handed to the training loop, which reports it
            if not self.stop.is_set():
                self._fail(exc)
        finally:
            with self._cond:
                self._scoring -= len(batch)
                self._score_calls -= 1
            self._wake()  # the training thread; a reward back lets admission go on
            self._send_to_scoring()  # what gathered meanwhile goes out now

    async def _rewards(self, items: list[ScoreItem]) -> list[ScoreResult]:
        """The items' rewards, a reward outage waited out (Recovery.score_async); a client with only a
        blocking score() (an in-process fake in the unit tests) is asked on a thread of its own."""
        if hasattr(self.reward, "score_async"):
            return await self.recovery.score_async(items)
        return await blocking(self.recovery.score, items)

    async def _score_batch(self, batch: list[ScoredGroupInput]) -> None:
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
        scored_items = iter(await self._rewards(items) if items else [])
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
        # Their samples for training and (all written) their records' JSON now, spread over the step,
        # not all at once at its start and end (issue 44)
        write_all = self.cfg.controller.samples_per_step is None
        for scored in scored_groups:
            prepare_for_training(self.samples, scored)
            if write_all:
                scored.record_pieces = group_pieces(scored)
        with self._cond:
            for scored in scored_groups:
                env_failed = sum(c.failed for c in scored.completions)
                self._failed["items"] += scored.failed - env_failed
                self._failed["groups"] += bool(scored.results) and scored.failed == len(scored.results)
                if env_failed:
                    self._env_failed.update(c.env_failure for c in scored.completions if c.failed)
                heapq.heappush(self._buffer, (scored.version, scored.seq, scored))
