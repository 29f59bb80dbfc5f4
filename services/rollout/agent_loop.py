"""The agent loop: multi-turn episodes against an environment server.

For every prompt of a Generate request, `n` episodes start from its data row. Then, over and over:

    generate one turn for every episode whose answer is in (the engine, batched) -> parse its tool
    calls -> send the turns to the environment (the round split into `max_concurrency` Step calls,
    all in flight at once) -> append each call's observations through the chat template as it
    arrives -> ...

An episode waiting for a slow tool holds up only the episodes of its own call, never the batch: once
the first call of a round has answered, the loop waits at most STRAGGLER_WAIT_S for the others, then
generates the next turn of the episodes answered; the late ones join a later round. With a fast
environment every call of a round answers together, so the turns stay batched as before.

until the environment says done, `max_turns` turns were taken, or the episode's token budget
(`max_episode_tokens`, and the model's context) has no room for another observation and turn;
an episode stopped before done is ended (End, reason `max_turns` or `length`), which may still give
it a reward. A group is yielded as soon as all its episodes are over. An environment that fails an
episode (down, slow, a bad reply) fails that episode alone, with the cause
(rlfleet.env.types.FAILURE_CAUSES); the controller leaves it out of training and counts it. The
episodes of a call that failed as a whole are ended with reason `failed`, and those the rollout gives
up (a failed generation, a cancelled request) with `aborted`: best effort, so that the server frees
what it holds.

Episode ids are `<request id>/<sample>:<tag>`, the tag random per agent loop, so that two rollout
processes (or two runs against one long-lived server) never name the same episode.

Every turn keeps the versions of the weights that generated it; the episode's `policy_version` is
the oldest of them, so the staleness bound holds for its oldest token even when new weights
arrive between turns.
"""
from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace

import structlog

from rlfleet.env.chat import ObservationRenderer
from rlfleet.env.episode import DONE, MAX_TURNS, TOKEN_BUDGET, Episode
from rlfleet.env.toolcalls import parse_tool_calls
from rlfleet.env.types import CALL_FAILURES, END_ABORTED, END_FAILED, Action, EpisodeRow, StepResult
from rlfleet.config import EnvConfig, RolloutConfig
from rlfleet.errors import ConfigError, InvalidRequest
from rlfleet.rpc.security import Security
from rlfleet.types import DataRow, GroupResult, PromptRequest, SamplingParams
from services.rollout.engine import RolloutEngine
from services.rollout.env_client import EnvClient
from services.rollout.env_transport import build_env_client

log = structlog.get_logger(__name__)

# How long the answers of a round may come after its first before the answered episodes go on without
# them: long against a local tool's milliseconds (a round stays one batch), short against a turn's decode.
STRAGGLER_WAIT_S = 0.25


class AgentLoop:
    def __init__(self, engine: RolloutEngine, env: EnvClient, tokenizer, max_turns: int,
                 max_episode_tokens: int | None, max_context: int, max_concurrency: int = 4):
        self.engine, self.env = engine, env
        self.max_concurrency = max_concurrency
        self._calls = ThreadPoolExecutor(max_concurrency, thread_name_prefix="episode-step")
        self.renderer = ObservationRenderer(tokenizer)
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.max_episode_tokens = max_episode_tokens
        self.max_context = max_context
        self.eos_ids = set(getattr(engine, "eos_ids", None) or [tokenizer.eos_token_id])
        self.tag = secrets.token_hex(4)  # in every episode id: unique across rollout processes

    def generate(self, prompts: list[PromptRequest], params: SamplingParams) -> Iterator[GroupResult]:
        episodes: dict[str, list[Episode]] = {}
        for p in prompts:
            if p.row is None:
                raise InvalidRequest(f"prompt {p.request_id!r} has no data row: with an environment every "
                                     "sample is an episode started from one")
            budget = self.max_context - len(p.prompt_ids)
            if self.max_episode_tokens is not None:
                budget = min(budget, self.max_episode_tokens)
            if budget < 1:
                raise InvalidRequest(f"prompt {p.request_id!r}: {len(p.prompt_ids)} tokens leave no room "
                                     f"for a response in the model's context of {self.max_context}")
            episodes[p.request_id] = [Episode(f"{p.request_id}/{i}:{self.tag}", list(p.prompt_ids), budget)
                                      for i in range(params.n)]
        rows = {p.request_id: p.row for p in prompts}
        everyone = [e for group in episodes.values() for e in group]
        started = False
        pending: dict[Future, list[Episode]] = {}  # the Step calls in flight and their episodes
        try:
            self._start(everyone, rows)
            started = True
            done_groups: set[str] = set()
            order = {e.episode_id: k for k, e in enumerate(everyone)}
            ready = [e for e in everyone if not e.finished]
            while True:
                yield from self._finished_groups(episodes, done_groups)
                if not ready and not pending:
                    return
                if ready:
                    self._generate_turn(ready, params)
                    share = -(-len(ready) // self.max_concurrency)  # all of a round's calls in flight at once
                    for k in range(0, len(ready), share):
                        chunk = ready[k:k + share]
                        pending[self._calls.submit(self._step, chunk)] = chunk
                ready = sorted(self._answered(pending), key=lambda e: order[e.episode_id])
        finally:  # a failed generation, or the caller stopped reading (a cancelled Generate)
            for call in pending:
                call.cancel()
            unfinished = [e.episode_id for e in everyone if not e.finished]
            if started and unfinished:
                self.env.end_quietly(unfinished, END_ABORTED)

    # ---- one phase each -----------------------------------------------------------------------
    def _start(self, episodes: list[Episode], rows: dict[str, DataRow]) -> None:
        starts = []
        for e in episodes:
            row = rows[e.episode_id.rsplit("/", 1)[0]]
            starts.append(EpisodeRow(episode_id=e.episode_id, data_source=row.data_source, prompt=row.prompt,
                                     ground_truth=row.ground_truth, extra_info=row.extra_info))
        results, _ = self.env.start(starts)
        for e, result in zip(episodes, results):
            if not result.ok:
                e.fail(result.failure, result.error)
                continue
            e.record_metrics(result.metrics)
            if result.done:  # nothing to do in this episode: it has no turn, so nothing to train on
                e.fail("episode_error", f"episode {e.episode_id}: the environment ended it at Start")
            elif not result.observation.empty:  # before the first assistant turn (a reward is ignored)
                trim, text = self.renderer.opening(result.observation, e.prompt_ids)
                ids = self.renderer.ids(text)
                if len(ids) - trim >= e.room:
                    e.fail("episode_error", f"episode {e.episode_id}: the opening observation "
                           f"({len(ids)} tokens) leaves no room for a turn")
                    continue
                e.prompt_trim = trim
                e.add_observation(ids, text)
        self._end_failed(episodes, results)

    def _generate_turn(self, running: list[Episode], params: SamplingParams) -> None:
        """The next turn of each episode, batched by its token room and turn number (the turn's seed)."""
        by_room: dict[tuple[int, int], list[Episode]] = defaultdict(list)
        for e in running:
            by_room[(min(params.max_new_tokens, e.room), len(e.turns) + 1)].append(e)
        for (max_new, turn), members in by_room.items():
            turn_params = replace(params, n=1, max_new_tokens=max_new,
                                  seed=None if params.seed is None else params.seed + 7919 * turn)
            requests = [PromptRequest(e.episode_id, e.context_ids) for e in members]
            by_id = {e.episode_id: e for e in members}
            for group in self.engine.generate(requests, turn_params):
                c = group.completions[0]
                text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
                by_id[group.request_id].add_turn(
                    c.token_ids, c.logprobs, c.policy_version, c.last_policy_version, text, c.finish_reason,
                    tool_calls=len(parse_tool_calls(text)))

    def _step(self, members: list[Episode]) -> tuple[list[StepResult], float]:
        """Sends the episodes' last turns to the environment: their answers and the call's wall time."""
        actions = [Action(episode_id=e.episode_id, text=e.turns[-1].text,
                          tool_calls=parse_tool_calls(e.turns[-1].text), turn=len(e.turns),
                          truncated=e.turns[-1].finish_reason == "length") for e in members]
        return self.env.step(actions)

    def _answered(self, pending: dict[Future, list[Episode]]) -> list[Episode]:
        """Waits for the first call in flight to answer and, briefly, for the rest of its round; applies
        the answers that came and returns the episodes that take another turn."""
        done, rest = wait(pending, return_when=FIRST_COMPLETED)
        if rest:
            late, _ = wait(rest, timeout=STRAGGLER_WAIT_S)
            done |= late
        answered = []
        for call in done:
            results, latency_s = call.result()
            answered += [(e, result, latency_s) for e, result in zip(pending.pop(call), results)]
        self._end_failed([e for e, _, _ in answered], [r for _, r, _ in answered])
        going_on: list[Episode] = []
        to_end: dict[str, list[Episode]] = defaultdict(list)
        for e, result, latency_s in answered:
            if not result.ok:
                e.fail(result.failure, result.error)
                continue
            e.record_answer(result, latency_s)
            e.record_metrics(result.metrics)
            if result.done:  # a final answer cut at the token limit is one cut at the budget, as in one turn
                e.finish(DONE if e.turns[-1].finish_reason == "stop" else TOKEN_BUDGET)
            elif len(e.turns) >= self.max_turns:
                to_end[MAX_TURNS].append(e)
            elif not self._observe(e, result, turn_ended_with_eos=e.token_ids[-1] in self.eos_ids):
                to_end[TOKEN_BUDGET].append(e)
            else:
                going_on.append(e)
        for reason, members in to_end.items():
            self._end(members, reason)
        return going_on

    def _observe(self, e: Episode, result: StepResult, turn_ended_with_eos: bool) -> bool:
        """Appends the observation if it leaves room for a turn; False (nothing appended) if not."""
        text = self.renderer.text(result.observation, turn_ended_with_eos)
        ids = self.renderer.ids(text)
        if len(ids) >= e.room:
            return False
        e.add_observation(ids, text)
        return True

    def _end(self, members: list[Episode], reason: str) -> None:
        results, latency_s = self.env.end([e.episode_id for e in members], reason)
        for e, result in zip(members, results):
            if not result.ok:
                e.fail(result.failure, result.error)
                continue
            if result.reward is not None:
                e.env_reward = result.reward
            e.record_metrics(result.metrics)
            e.finish(reason)

    def _end_failed(self, episodes: list[Episode], results: list[StepResult]) -> None:
        """Episodes of a call that failed as a whole may still be held by the server: End(failed), best
        effort (an episode the server failed itself, ok=false, is over there already)."""
        failed = [e.episode_id for e, r in zip(episodes, results) if not r.ok and r.failure in CALL_FAILURES]
        if failed:
            self.env.end_quietly(failed, END_FAILED)

    @staticmethod
    def _finished_groups(episodes: dict[str, list[Episode]], done: set[str]) -> Iterator[GroupResult]:
        for request_id, group in episodes.items():
            if request_id not in done and all(e.finished for e in group):
                done.add(request_id)
                yield GroupResult(request_id=request_id, completions=[e.completion() for e in group])


def build_agent(engine: RolloutEngine, rollout: RolloutConfig, env: EnvConfig,
                security: Security | None = None) -> AgentLoop:
    """The agent loop over `engine` against the environment server at env.address, reached with the
    job's TLS and bearer token (`security`; None: plain gRPC), as the fleet's own services are."""
    if not env.address:
        raise ConfigError(f"env.name={env.name!r} is served by `rlfleet run`; a rollout started on its own "
                          "needs env.address (serve it with `rlfleet env serve NAME --port P`)")
    tokenizer = getattr(engine, "tokenizer", None)
    max_context = getattr(engine, "max_seq_len", None) or getattr(engine, "max_model_len", None)
    if tokenizer is None or max_context is None:
        raise ConfigError(f"rollout.backend={rollout.backend} exposes no tokenizer or context length: it "
                          "cannot run multi-turn episodes (env.*)")
    client = build_env_client(env, security)  # by env.kind: gRPC or OpenEnv
    return AgentLoop(engine, client, tokenizer, rollout.max_turns, rollout.max_episode_tokens, max_context,
                     env.max_concurrency)
