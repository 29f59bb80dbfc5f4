"""env.kind=openenv against real OpenEnv servers (openenv-core's create_fastapi_app, tests/openenv_servers):
the action mapping (text, typed, MCP), observations and rewards, one session per episode, and the
failures that stay with their episodes (server gone, late, malformed, at capacity); the agent loop on the
tiny model against one; `rlfleet env check http://…`; the config's rules."""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import pytest
import torch

from rlfleet.app.cli import main
from rlfleet.config import load_config
from rlfleet.env.openenv import TEXT, TYPED, Endpoint
from rlfleet.env.types import Action, EpisodeRow, ToolCall
from rlfleet.errors import ConfigError
from rlfleet.models.tiny import ensure_tiny_model
from rlfleet.rpc.env_describe import job_tool_prompt
from rlfleet.types import DataRow, PromptRequest, SamplingParams
from services.rollout.agent_loop import AgentLoop
from services.rollout.engines.hf import HFEngine
from services.rollout.openenv_client import OpenEnvClient
from tests import openenv_servers
from tests.openenv_servers import serving

pytestmark = pytest.mark.service


def rows(*truths: str) -> list[EpisodeRow]:
    return [EpisodeRow(f"e{i}", "digits_reverse", "Reverse the digits", t) for i, t in enumerate(truths)]


def call(episode_id: str, name: str, **arguments) -> Action:
    return Action(episode_id, "...", (ToolCall(name, arguments),))


@contextlib.contextmanager
def client_of(address: str, reward: str = "sum", timeout_s: float = 10.0):
    client = OpenEnvClient(address, timeout_s=timeout_s, max_concurrency=4, reward=reward)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def digits():
    with serving("digits") as address:
        yield address


def test_a_text_action_takes_the_reply_and_each_episode_has_its_own_session(digits):
    with client_of(digits) as client:
        started, _ = client.start(rows("123", "45"))
        assert [r.ok and not r.done and r.observation.empty for r in started] == [True, True]
        assert client.spec.mode == TEXT and client.spec.text_field == "message"
        # e0 right at once (done, reward 1.0); e1 wrong: asked again (the server's feedback, a user message)
        answers, _ = client.step([Action("e0", " 123\n"), Action("e1", "99")])
        assert answers[0].done and answers[0].reward == 1.0 and answers[0].observation.empty
        assert not answers[1].done and answers[1].reward == 0.0
        feedback = [(m.role, m.content) for m in answers[1].observation.messages]
        assert feedback == [("user", "Reverse the digits: 54")]
        assert list(client._sessions) == ["e1"]  # a done episode's session is closed
        # second try of e1: half the digits right, less 0.25 for the extra try; summed with the 0.0 before
        last, _ = client.step([Action("e1", "49")])
        assert last[0].done and last[0].reward == pytest.approx(0.5 - 0.25)
        assert client._sessions == {}


@pytest.mark.parametrize("mode, expected", [("sum", -0.2), ("last", -0.1), ("service", None)])
def test_env_reward_sum_last_or_service(mode, expected):
    with serving("guess") as address, client_of(address, reward=mode) as client:
        client.start(rows("7"))
        client.step([call("e0", "GuessNumber", guess=3)])  # "higher", -0.1
        answer, _ = client.step([call("e0", "GuessNumber", guess=9)])  # "lower", -0.1
        ended, _ = client.end(["e0"], "max_turns")
    assert answer[0].reward == (pytest.approx(expected) if expected is not None else None)
    assert ended[0].ok and ended[0].reward == answer[0].reward


def test_a_typed_action_is_one_tool_whose_arguments_are_its_fields():
    with serving("guess") as address, client_of(address) as client:
        started, _ = client.start(rows("7", "7", "7"))
        opening = json.loads(started[0].observation.messages[0].content)
        assert opening == {"hint": "Guess the number.", "guesses": 0}
        (tool,) = client.spec.tools
        assert client.spec.mode == TYPED and tool.name == "GuessNumber"
        assert tool.parameters["required"] == ["guess"]
        assert set(tool.parameters["properties"]) == {"guess", "reason"}
        answers, _ = client.step([call("e0", "GuessNumber", guess=7, reason="why not"),
                                  call("e1", "GuessNumber", guess="seven"),  # the server rejects it
                                  Action("e2", "I think it is 7")])  # no call at all
    right, rejected, no_call = answers
    assert right.done and right.reward == 1.0 and right.observation.messages[0].role == "tool"
    assert json.loads(right.observation.messages[0].content) == {"hint": "right", "guesses": 1}
    for told in (rejected, no_call):  # told to the model, not a failure: the episode goes on
        assert told.ok and not told.done and told.tool_errors == 1 and told.reward is None
    why = rejected.observation.messages[0].content
    assert "rejected" in why and "guess" in why
    assert "call one of GuessNumber" in no_call.observation.messages[0].content


def test_an_mcp_environment_offers_its_tools():
    with serving("calculator") as address, client_of(address, reward="last") as client:
        client.start(rows("0", "0"))
        assert client.spec.tool_names == ("add", "multiply")
        answers, _ = client.step([call("e0", "multiply", a=6, b=7), call("e1", "multiply", a=6, b="x")])
        assert answers[0].observation.messages[0].content == "42.0" and answers[0].tool_errors == 0
        assert answers[1].observation.messages[0].content.startswith("error: ")
        assert answers[1].tool_errors == 1
        done, _ = client.step([call("e0", "add", a=1, b=2), call("e1", "add", a=1, b=2)])
        assert [d.done for d in done] == [True, True] and done[0].reward == 0.5


def test_tools_go_into_the_prompts_from_the_schema(tiny_tokenizer):
    with serving("guess") as address:
        cfg = load_config(None, ["env.kind=openenv", f"env.address={address}"])
        tool_prompt = job_tool_prompt(cfg.env, 30.0, tiny_tokenizer)
    assert tool_prompt is not None and [s.name for s in tool_prompt.specs] == ["GuessNumber"]
    with serving("digits") as address:  # a text action: no tools
        cfg = load_config(None, ["env.kind=openenv", f"env.address={address}"])
        assert job_tool_prompt(cfg.env, 30.0, tiny_tokenizer) is None


# ---- failures stay with their episodes -------------------------------------------------------------
def test_a_server_that_is_down_or_goes_away_fails_the_episodes_unavailable():
    with serving("digits") as address, client_of(address) as client:
        assert all(r.ok for r in client.start(rows("12", "34"))[0])
        gone = address
    with client_of(gone) as client:
        client.spec = None
        down, _ = client.start(rows("12"))
    assert down[0].failure == "unavailable" and gone in down[0].error and "episode e0" in down[0].error


def test_a_session_dropped_mid_episode_fails_it_unavailable():
    with serving("digits") as address:
        client = OpenEnvClient(address, timeout_s=10.0)
        assert all(r.ok for r in client.start(rows("12"))[0])
    try:  # the server stopped while the episode was running
        answer, _ = client.step([Action("e0", "1")])
    finally:
        client.close()
    assert not answer[0].ok and answer[0].failure == "unavailable" and "episode e0" in answer[0].error


class RawServer:
    """A WebSocket server that is not OpenEnv: answers `reply(message)` (None: never answers)."""

    def __init__(self, reply):
        self.reply, self.loop = reply, asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from websockets.asyncio.server import serve

        async def handler(ws):
            async for raw in ws:
                message = json.loads(raw)
                if message.get("type") == "close":
                    return
                answer = self.reply(message)
                if answer is not None:
                    await ws.send(answer)

        async def main_():
            async with serve(handler, "127.0.0.1", 0) as server:
                self.port = server.sockets[0].getsockname()[1]
                self.stop = self.loop.create_future()
                self.ready.set()
                await self.stop

        self.loop.run_until_complete(main_())

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(30)
        return f"ws://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.stop.set_result, None)
        self.thread.join(30)


GOOD_RESET = json.dumps({"type": "observation", "data": {"observation": {}, "reward": None, "done": False}})


@pytest.mark.parametrize("step_reply, words", [
    ("not json", "not JSON"),
    (json.dumps({"type": "observation", "data": {"observation": "a string"}}), "expected {type: observation"),
    (json.dumps({"type": "observation", "data": {"observation": {}, "reward": "high"}}), "reward 'high'"),
    ('{"type": "observation", "data": {"observation": {}, "reward": NaN}}', "non-finite reward"),
    (json.dumps({"type": "observation", "data": {"observation": {}, "done": "yes"}}), "done 'yes'"),
])
def test_a_malformed_observation_fails_that_episode_invalid_reply(step_reply, words):
    spec = openenv_servers_text_spec()
    replies = lambda m: GOOD_RESET if m["type"] == "reset" else step_reply  # noqa: E731
    with RawServer(replies) as address:
        client = OpenEnvClient(address, timeout_s=10.0, spec=spec)
        try:
            assert client.start(rows("1"))[0][0].ok
            answer, _ = client.step([Action("e0", "1")])
        finally:
            client.close()
    assert answer[0].failure == "invalid_reply" and words in answer[0].error, answer[0].error


def test_a_late_answer_fails_the_episode_timeout():
    with RawServer(lambda m: GOOD_RESET if m["type"] == "reset" else None) as address:
        # 3 s: the reset (a connection and a reply) fits in it on a loaded machine; the step never answers
        client = OpenEnvClient(address, timeout_s=3.0, spec=openenv_servers_text_spec())
        try:
            assert client.start(rows("1"))[0][0].ok
            answer, _ = client.step([Action("e0", "1")])
        finally:
            client.close()
    assert answer[0].failure == "timeout" and "3s" in answer[0].error, answer[0].error


def test_a_server_at_capacity_fails_the_extra_episodes_naming_max_concurrent_envs(monkeypatch):
    monkeypatch.setattr(openenv_servers, "MAX_SESSIONS", 1)
    with serving("digits") as address, client_of(address) as client:
        started, _ = client.start(rows("1", "2"))
    assert sorted(r.ok for r in started) == [False, True]
    refused = next(r for r in started if not r.ok)
    assert refused.failure == "episode_error" and "max_concurrent_envs" in refused.error


def openenv_servers_text_spec():
    from rlfleet.env.openenv import ActionSpec

    return ActionSpec(TEXT, text_field="message", schema_title="Attempt")


# ---- the agent loop on the tiny model -----------------------------------------------------------------
def test_the_agent_loop_plays_multi_turn_episodes_against_an_openenv_server(digits):
    engine = HFEngine(ensure_tiny_model(), torch.device("cpu"), torch.float32)
    prompts = []
    for i, d in enumerate(("4721", "905")):
        text = engine.tokenizer.apply_chat_template([{"role": "user", "content": f"Reverse the digits: {d}"}],
                                                    tokenize=False, add_generation_prompt=True)
        prompts.append(PromptRequest(f"p{i}", engine.tokenizer(text, add_special_tokens=False)["input_ids"],
                                     DataRow("digits_reverse", text, d[::-1])))
    with client_of(digits) as client:
        loop = AgentLoop(engine, client, engine.tokenizer, 2, None, engine.max_seq_len)
        groups = list(loop.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=3)))
        assert client._sessions == {}  # every session closed: done, or ended at max_turns
    episodes = [c for g in groups for c in g.completions]
    assert len(episodes) == 8 and not any(c.failed for c in episodes)
    assert all(c.env_reward is not None and 1 <= len(c.turns) <= 2 for c in episodes)
    two = [c for c in episodes if len(c.turns) == 2]
    assert two, "no episode took a second turn"
    assert "Reverse the digits: " in two[0].turns[0].observation  # the server's feedback, templated
    assert len(two[0].loss_mask) == len(two[0].token_ids) and 0 in two[0].loss_mask


# ---- rlfleet env check and the config -------------------------------------------------------------
@pytest.mark.parametrize("name, mapping", [("digits", "text action: the reply goes into Attempt.message"),
                                           ("guess", "typed action GuessNumber as a tool: GuessNumber"),
                                           ("calculator", "MCP tools: add, multiply")])
def test_env_check_runs_the_checks_that_apply_to_an_openenv_server(name, mapping, capsys):
    with serving(name) as address:
        assert main(["env", "check", address]) == 0
    out = capsys.readouterr().out
    assert f"OpenEnv server {address}" in out and mapping in out and "summary: 7 PASS, 0 FAIL, 0 N/A" in out


def test_env_check_fails_a_server_at_capacity_and_one_that_is_not_there(monkeypatch, capsys):
    monkeypatch.setattr(openenv_servers, "MAX_SESSIONS", 2)
    with serving("digits") as address:
        assert main(["env", "check", address]) == 1
    out = capsys.readouterr().out
    assert "sessions at once" in out and "max_concurrent_envs" in out
    assert main(["env", "check", address]) == 1  # stopped now
    assert "health (GET /health)  FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, words", [
    (["env.address=http://127.0.0.1:1"], "env.kind=openenv"),
    (["env.kind=openenv", "env.name=digits_game"], "env.name='digits_game'"),
    (["env.reward=sum", "env.address=127.0.0.1:1"], "env.reward=sum applies to env.kind=openenv"),
    (["env.kind=openenv", "env.address=ftp://x:1"], None),
])
def test_config_rules_name_the_key(overrides, words):
    if words is None:  # the scheme is checked where the address is used
        with pytest.raises(ConfigError, match="http://HOST:PORT or ws://HOST:PORT"):
            OpenEnvClient(load_config(None, overrides).env.address)
        return
    with pytest.raises(ConfigError, match=words):
        load_config(None, overrides)


def test_endpoints_of_the_address_forms():
    assert Endpoint.parse("http://h:8000") == Endpoint("http://h:8000", "ws://h:8000/ws")
    assert Endpoint.parse("ws://h:8000/ws") == Endpoint("http://h:8000", "ws://h:8000/ws")
    assert Endpoint.parse("https://h/env/") == Endpoint("https://h/env", "wss://h/env/ws")
    assert Endpoint.parse("h:1") == Endpoint("http://h:1", "ws://h:1/ws")


def test_status_reads_an_openenv_servers_health_from_its_http_endpoint():
    from rlfleet.app import status

    with serving("digits") as address:
        row = {"role": "env", "address": address, "health": "", "last_error": ""}
        status._query_openenv(row)
        assert row["health"] == "SERVING" and not row["last_error"]
    status._query_openenv(row)  # the server is gone now
    assert row["health"] == "UNREACHABLE" and f"{address}/health" in row["last_error"]


def test_a_session_its_episode_left_idle_is_closed_when_episodes_start_later(digits):
    """An episode the agent loop gave up on (its Generate call cancelled) holds a session slot on the
    server until it has been idle for idle_s; the next start closes it."""
    import time

    client = OpenEnvClient(digits, timeout_s=10.0, idle_s=0.5)
    try:
        client.start([EpisodeRow("abandoned", "d", "p", "12")])
        time.sleep(1.0)
        client.start([EpisodeRow("fresh", "d", "p", "34")])
        assert list(client._sessions) == ["fresh"] and list(client._tallies) == ["fresh"]
    finally:
        client.close()
