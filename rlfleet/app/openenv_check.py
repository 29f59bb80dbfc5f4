"""`rlfleet env check http://HOST:PORT` (or ws://): the checks of `rlfleet env check` that apply to an
OpenEnv server, on its own wire (rlfleet/rpc/openenv_wire.py) and with rlfleet's mapping
(rlfleet/env/openenv.py): what a run with env.kind=openenv will meet.

Episodes start from the same row as the gRPC check's (`--row`); the turns played are `--action` texts
(a text action takes them as they are; a tool action reads their tool calls), by default the digits
answer for a text action and, for a tool action, a call whose required arguments are filled with
placeholders of their types.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from rlfleet.app import conformance
from rlfleet.app.conformance import FAIL, NA, Check, Failed, run_checks
from rlfleet.env.openenv import (MCP, TEXT, ActionSpec, BadReply, Endpoint, build_action, parse_answer,
                                 reset_arguments)
from rlfleet.env.toolcalls import parse_tool_calls
from rlfleet.env.types import Action, EpisodeRow
from rlfleet.rpc.openenv_wire import (CAPACITY_REACHED, ServerError, Session, TimedOut, Unreachable,
                                      fetch_action_spec, get_json, health_problem)

DEFAULT_ROW = {"data_source": "digits_reverse", "prompt": "Reverse the digits: 4721", "ground_truth": "1274"}
MAX_TURNS = 8
SESSIONS = 8  # opened at once: the rollout holds one per episode in flight
_PLACEHOLDERS = {"string": "x", "integer": 0, "number": 0.0, "boolean": False, "array": [], "object": {}}


def is_openenv_address(address: str) -> bool:
    return address.split("://", 1)[0] in ("http", "https", "ws", "wss")


class OpenEnvChecker:
    def __init__(self, address: str, timeout_s: float = 10.0, row: dict | None = None,
                 actions: list[str] | None = None):
        self.address, self.timeout_s = address, timeout_s
        self.endpoint = Endpoint.parse(address)
        self.row = {**DEFAULT_ROW, **(row or {})}
        self.actions = actions
        self.spec: ActionSpec | None = None

    def episode_row(self, n: int) -> EpisodeRow:
        extra = self.row.get("extra_info_json") or "{}"
        return EpisodeRow(episode_id=f"check-{n}", data_source=self.row.get("data_source", ""),
                          prompt=self.row.get("prompt", ""), ground_truth=self.row.get("ground_truth", ""),
                          extra_info=json.loads(extra))

    def turn(self, episode_id: str, turn: int) -> Action:
        if self.actions:
            text = self.actions[(turn - 1) % len(self.actions)]
        elif self.spec.mode == TEXT:
            text = self.row["ground_truth"]
        else:
            tool = self.spec.tools[0]
            required = (tool.parameters or {}).get("required") or []
            properties = (tool.parameters or {}).get("properties") or {}
            arguments = {k: _PLACEHOLDERS.get(properties.get(k, {}).get("type"), "x") for k in required}
            text = f'<tool_call>{json.dumps({"name": tool.name, "arguments": arguments})}</tool_call>'
        return Action(episode_id=episode_id, text=text, tool_calls=parse_tool_calls(text), turn=turn)

    # ---- checks ------------------------------------------------------------------------------------
    def check_health(self) -> str:
        problem = health_problem(self.endpoint, self.timeout_s)
        if problem is not None:
            raise Failed(problem)
        return "healthy"

    def check_schema(self) -> str:
        self.spec = fetch_action_spec(self.endpoint, self.timeout_s)
        if self.spec.mode == TEXT:
            return f"text action: the reply goes into {self.spec.schema_title}.{self.spec.text_field}"
        kind = "MCP tools" if self.spec.mode == MCP else f"typed action {self.spec.schema_title} as a tool"
        return f"{kind}: {', '.join(self.spec.tool_names)}"

    def check_metadata(self) -> Any:
        try:
            meta = get_json(self.endpoint.http + "/metadata", self.timeout_s)
        except BadReply:
            return NA
        return f"name {meta.get('name')!r}" if isinstance(meta, dict) else NA

    def check_episode(self) -> str:
        self._need_spec()
        return asyncio.run(self._episode())

    async def _episode(self) -> str:
        session = await Session.open(self.endpoint.ws, self.timeout_s)
        try:
            row = self.episode_row(1)
            answer = parse_answer(await session.request({"type": "reset", "data": reset_arguments(row)},
                                                        self.timeout_s), "user")
            if answer.done:
                raise Failed("reset answered done: the episode has no turn to play")
            rewards, told = [], 0
            for turn in range(1, MAX_TURNS + 1):
                built = build_action(self.spec, self.turn(row.episode_id, turn))
                if built.action is None:
                    raise Failed(f"turn {turn}: the turn played makes no action: {built.error} "
                                 "(pass --action)")
                try:
                    reply = await session.request({"type": "step", "data": built.action}, self.timeout_s)
                except ServerError as err:
                    raise Failed(f"turn {turn}: step {json.dumps(built.action)[:120]} answered {err}") \
                        from None
                role = "user" if self.spec.mode == TEXT else "tool"
                answer = parse_answer(reply, role, self.spec.mode == MCP)
                rewards.append(answer.reward)
                told += int(answer.tool_error)
                if answer.done:
                    return (f"done after {turn} turn{'s' * (turn != 1)}; rewards {rewards}"
                            + (f"; {told} tool errors" if told else ""))
            return (f"not done after {MAX_TURNS} turns (the rollout ends it at rollout.max_turns); "
                    f"rewards {rewards}")
        finally:
            await session.close()

    def check_sessions(self) -> str:
        self._need_spec()
        return asyncio.run(self._sessions())

    async def _sessions(self) -> str:
        async def one(n: int) -> None:
            session = await Session.open(self.endpoint.ws, self.timeout_s)
            try:
                await session.request({"type": "reset", "data": reset_arguments(self.episode_row(n))},
                                      self.timeout_s)
                await asyncio.sleep(0.2)  # all held at once
            finally:
                await session.close()

        results = await asyncio.gather(*(one(n) for n in range(10, 10 + SESSIONS)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if any(isinstance(e, ServerError) and e.code == CAPACITY_REACHED for e in errors):
            raise Failed(f"{len(errors)} of {SESSIONS} sessions refused at capacity: the rollout holds "
                         "one session per episode in flight; start the server with max_concurrent_envs of at "
                         "least rollout.n x the prompts in flight")
        if errors:
            raise Failed(f"{len(errors)} of {SESSIONS} sessions failed: {errors[0]}")
        return f"{SESSIONS} sessions at once"

    def check_invalid_action(self) -> str:
        self._need_spec()
        return asyncio.run(self._invalid_action())

    async def _invalid_action(self) -> str:
        session = await Session.open(self.endpoint.ws, self.timeout_s)
        try:
            await session.request({"type": "reset", "data": reset_arguments(self.episode_row(2))},
                                  self.timeout_s)
            bad = {"rlfleet_check_no_such_field": [1, 2]} if self.spec.mode != TEXT else {}
            try:
                await session.request({"type": "step", "data": bad}, self.timeout_s)
            except ServerError as err:
                detail = f"answered {err.code}"
            else:
                return "accepted (the action has no required field)"
            await session.request({"type": "reset", "data": reset_arguments(self.episode_row(3))},
                                  self.timeout_s)
            return detail + "; the session still serves"
        finally:
            await session.close()

    def check_still_healthy(self) -> str:
        return self.check_health()

    def _need_spec(self) -> None:
        if self.spec is None:
            raise Failed("no action mapping (the schema check failed)")

    def run(self) -> list[Check]:
        first = run_checks(self, CHECKS[:1])
        if first[0].result == FAIL:  # nothing answers: the other checks would only repeat it
            return first
        return first + run_checks(self, tuple((name, _typed(method)) for name, method in CHECKS[1:]))


def _typed(method):
    """The check, its wire errors (unreachable, late, malformed, an error answer) a FAIL saying so."""
    def check(checker: OpenEnvChecker):
        try:
            return method(checker)
        except (Unreachable, TimedOut, BadReply, ServerError) as err:
            raise Failed(f"{type(err).__name__}: {err}") from None
    return check


CHECKS = (
    ("health (GET /health)", OpenEnvChecker.check_health),
    ("schema and action mapping", OpenEnvChecker.check_schema),
    ("metadata (optional)", OpenEnvChecker.check_metadata),
    ("episode: reset, steps to done", OpenEnvChecker.check_episode),
    ("sessions at once", OpenEnvChecker.check_sessions),
    ("invalid action", OpenEnvChecker.check_invalid_action),
    ("serves after errors", OpenEnvChecker.check_still_healthy),
)


def check_server(address: str, timeout_s: float = 10.0, row: dict | None = None,
                 actions: list[str] | None = None) -> list[Check]:
    return OpenEnvChecker(address, timeout_s, row, actions).run()


def format_table(address: str, checks: list[Check]) -> str:
    return conformance.format_table("OpenEnv", address, checks)


__all__ = ["FAIL", "check_server", "format_table", "is_openenv_address"]
