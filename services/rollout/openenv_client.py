"""Client of an OpenEnv server (env.kind=openenv), behind the same interface as the gRPC one
(services/rollout/env_client.py: start, step, end, close; one StepResult per episode, in order).

Each episode has a WebSocket session of its own, opened by `start` (reset) and closed when the
episode is done, fails, or is ended. The calls of a turn run together on one event loop (a thread
of this client), `max_concurrency` messages in flight at once, each with the deadline `timeout_s`.
The mapping of rows, turns, observations and rewards is rlfleet/env/openenv.py's. Failures come
back per episode with their cause, as the gRPC client's do, and close that episode's session:

    unavailable    the server cannot be reached, or the session's connection dropped (a server
                   that died: the controller waits it out up to env.max_outage_s)
    timeout        no answer within env.timeout_s
    invalid_reply  an answer that is not OpenEnv's format (a malformed observation, reward, done)
    episode_error  the server answered an error (its step raised, it is at capacity, ...)

An action the server rejects as invalid (VALIDATION_ERROR) is not a failure: the model is told
the server's message, as a tool error, and the episode goes on. A session left open by an episode
the agent loop gave up on (its Generate call cancelled) is closed once idle for `idle_s`, so that
such sessions do not use up the server's session slots.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Sequence

from rlfleet.env.openenv import (MCP, TEXT, ActionSpec, BadReply, RewardTally, build_action, parse_answer,
                                 reset_arguments)
from rlfleet.env.types import (EPISODE_ERROR, INVALID_REPLY, TIMEOUT, UNAVAILABLE, Action, EpisodeRow,
                               Message, Observation, StepResult)
from rlfleet.rpc.openenv_wire import (CAPACITY_REACHED, VALIDATION_ERROR, ServerError, Session, TimedOut,
                                      Unreachable, endpoint_of, fetch_action_spec)


def failed(episode_id: str, cause: str, error: str) -> StepResult:
    return StepResult(episode_id=episode_id, ok=False, failure=cause, error=error)


class OpenEnvClient:
    def __init__(self, address: str, timeout_s: float = 30.0, max_concurrency: int = 4, reward: str = "sum",
                 spec: ActionSpec | None = None, idle_s: float | None = None):
        self.address, self.timeout_s, self.reward_mode = address, timeout_s, reward
        self.endpoint = endpoint_of(address)
        self.spec = spec
        RewardTally(reward)  # checks the mode now
        self._sessions: dict[str, Session] = {}
        self._last_used: dict[str, float] = {}
        self.idle_s = idle_s if idle_s is not None else max(600.0, 20 * timeout_s)
        self._tallies: dict[str, RewardTally] = {}
        self._loop = asyncio.new_event_loop()
        self._limit = asyncio.Semaphore(max_concurrency)
        self._thread = threading.Thread(target=self._loop.run_forever, name="openenv-client", daemon=True)
        self._thread.start()

    # ---- the agent loop's interface --------------------------------------------------------------
    def start(self, rows: Sequence[EpisodeRow]) -> tuple[list[StepResult], float]:
        if rows and self.spec is None:
            try:
                self.spec = fetch_action_spec(self.endpoint, self.timeout_s)
            except Exception as err:  # noqa: BLE001 - typed below; the episodes fail with the cause
                return [failed(r.episode_id, _cause(err), f"episode {r.episode_id}: {self._name(err)}")
                        for r in rows], 0.0
        now = time.monotonic()
        idle = [i for i, used in self._last_used.items() if now - used > self.idle_s]
        if idle:
            self._run([self._abandon(i) for i in idle])
        return self._run([self._start(r) for r in rows])

    def step(self, actions: Sequence[Action]) -> tuple[list[StepResult], float]:
        return self._run([self._step(a) for a in actions])

    def end(self, episode_ids: Sequence[str], reason: str) -> tuple[list[StepResult], float]:
        return self._run([self._end(i) for i in episode_ids])

    def end_quietly(self, episode_ids: Sequence[str], reason: str) -> None:
        """Best effort, not waited for (the agent loop's End of episodes it gives up): their sessions
        close, which is how an OpenEnv server learns an episode is over."""
        if not episode_ids or self._loop.is_closed():
            return
        calls = [self._end(i) for i in episode_ids]

        async def together():
            await asyncio.gather(*calls, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(together(), self._loop)
        except RuntimeError:  # the client is closing: nothing left to end
            for call in calls:
                call.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        ids = list(self._sessions)
        if ids:
            self._run([self._close_session(i) for i in ids])
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # ---- one episode each, on the client's loop ----------------------------------------------------
    def _run(self, calls: list[Awaitable]) -> tuple[list, float]:
        if not calls:
            return [], 0.0
        started = time.perf_counter()

        async def together():
            return await asyncio.gather(*calls)

        results = asyncio.run_coroutine_threadsafe(together(), self._loop).result()
        return list(results), time.perf_counter() - started

    async def _start(self, row: EpisodeRow) -> StepResult:
        episode_id = row.episode_id
        await self._close_session(episode_id)  # an id started again starts afresh
        try:
            async with self._limit:
                session = await Session.open(self.endpoint.ws, self.timeout_s)
                self._sessions[episode_id] = session
                self._last_used[episode_id] = time.monotonic()
                self._tallies[episode_id] = RewardTally(self.reward_mode)
                reply = await session.request({"type": "reset", "data": reset_arguments(row)}, self.timeout_s)
            answer = parse_answer(reply, "user")
        except Exception as err:  # noqa: BLE001 - typed by _fail
            return await self._fail(episode_id, "reset", err)
        return await self._answered(episode_id, answer.observation, answer.reward, answer.done)

    async def _step(self, turn: Action) -> StepResult:
        episode_id = turn.episode_id
        session = self._sessions.get(episode_id)
        if session is None:
            return failed(episode_id, EPISODE_ERROR, f"episode {episode_id}: no open session on OpenEnv "
                          f"server {self.address} (the episode was not started, or is over)")
        self._last_used[episode_id] = time.monotonic()
        built = build_action(self.spec, turn)
        if built.action is None:
            return self._told(episode_id, built.error)
        try:
            async with self._limit:
                reply = await session.request({"type": "step", "data": built.action}, self.timeout_s)
            answer = parse_answer(reply, "user" if self.spec.mode == TEXT else "tool", self.spec.mode == MCP)
        except ServerError as err:
            if err.code == VALIDATION_ERROR:
                return self._told(episode_id, f"error: the action was rejected: {err.message}")
            return await self._fail(episode_id, "step", err)
        except Exception as err:  # noqa: BLE001 - typed by _fail
            return await self._fail(episode_id, "step", err)
        return await self._answered(episode_id, answer.observation, answer.reward, answer.done,
                                    tool_errors=int(answer.tool_error))

    async def _end(self, episode_id: str) -> StepResult:
        tally = self._tallies.pop(episode_id, None)
        await self._close_session(episode_id)
        return StepResult(episode_id=episode_id, reward=tally.value if tally else None, done=True)

    # ---- helpers -----------------------------------------------------------------------------------
    async def _answered(self, episode_id: str, observation: Observation, reward: float | None,
                        done: bool, tool_errors: int = 0) -> StepResult:
        value = self._tallies[episode_id].add(reward)
        if done:
            self._tallies.pop(episode_id, None)
            await self._close_session(episode_id)
        return StepResult(episode_id=episode_id, observation=observation, reward=value, done=done,
                          tool_errors=tool_errors)

    def _told(self, episode_id: str, error: str) -> StepResult:
        """A turn that was not sent: the model is told why (one tool error); the episode goes on."""
        role = "user" if self.spec.mode == TEXT else "tool"
        return StepResult(episode_id=episode_id, observation=Observation(messages=(Message(role, error),)),
                          reward=self._tallies[episode_id].value, tool_errors=1)

    async def _fail(self, episode_id: str, what: str, err: Exception) -> StepResult:
        self._tallies.pop(episode_id, None)
        await self._close_session(episode_id)
        return failed(episode_id, _cause(err), f"episode {episode_id}: OpenEnv server {self.address} "
                                               f"{what}: {self._name(err)}")

    def _name(self, err: Exception) -> str:
        if isinstance(err, ServerError) and err.code == CAPACITY_REACHED:
            return (f"{err}: the server admits fewer sessions than episodes in flight (one per episode): "
                    "raise its max_concurrent_envs, or lower rollout.n / the prompts in flight")
        if isinstance(err, BadReply):
            return f"a reply that breaks OpenEnv's format: {err}"
        return str(err) or type(err).__name__

    async def _abandon(self, episode_id: str) -> None:
        self._tallies.pop(episode_id, None)
        await self._close_session(episode_id)

    async def _close_session(self, episode_id: str) -> None:
        self._last_used.pop(episode_id, None)
        session = self._sessions.pop(episode_id, None)
        if session is not None:
            await session.close()


def _cause(err: Exception) -> str:
    if isinstance(err, Unreachable):
        return UNAVAILABLE
    if isinstance(err, TimedOut):
        return TIMEOUT
    if isinstance(err, BadReply):
        return INVALID_REPLY
    return EPISODE_ERROR
