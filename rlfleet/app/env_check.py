"""`rlfleet env check ADDRESS`: does an environment server keep the rlfleet.v1.Environment contract?

Each check is one small conversation with the server; the result is PASS, FAIL (the contract is
broken; the detail says how) or N/A (an optional part the server does not implement). Episodes
start from a digits row by default and are played with a tool call, then a plain answer; a server
for other data takes `--row '{"data_source": …, "prompt": …, "ground_truth": …}'` and
`--action TEXT` (repeatable: the turns played, in order, cycling).
"""
from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import grpc

from rlfleet.env.toolcalls import parse_tool_calls
from rlfleet.env.types import Action
from rlfleet.proto.v1 import environment_pb2 as pb
from rlfleet.proto.v1 import environment_pb2_grpc
from rlfleet.rpc import env_convert
from rlfleet.app import conformance
from rlfleet.app.conformance import FAIL, NA, PASS, Check, Failed, ServerChecker  # noqa: F401 (re-exported)

ENV_SERVICE = "rlfleet.v1.Environment"
DEFAULT_ROW = {"data_source": "digits_reverse", "prompt": "Reverse the digits: 4721", "ground_truth": "1274"}
DEFAULT_ACTIONS = ['Let me check. <tool name="calculator">6*7</tool>', "1274"]
MAX_TURNS = 8


class EnvContractChecker(ServerChecker):
    SERVICE = ENV_SERVICE

    def __init__(self, address: str, timeout_s: float = 10.0, row: dict | None = None,
                 actions: list[str] | None = None, security=None):
        """`security`: TLS and bearer token to reach a secured server (rlfleet.rpc.security.Security)."""
        super().__init__(address, timeout_s, security)
        self.row = row or DEFAULT_ROW
        self.actions = actions or DEFAULT_ACTIONS
        self.stub = environment_pb2_grpc.EnvironmentStub(self.channel)
        self._ids = 0

    # ---- requests ---------------------------------------------------------------------------------
    def starts(self, count: int, **override: str) -> list[pb.EpisodeStart]:
        out = []
        for _ in range(count):
            self._ids += 1
            fields = {"episode_id": f"check-{self._ids}", "data_source": "", "prompt": "", "ground_truth": "",
                      "extra_info_json": "", **self.row, **override}
            out.append(pb.EpisodeStart(**fields))
        return out

    def action(self, episode_id: str, turn: int) -> Action:
        text = self.actions[(turn - 1) % len(self.actions)]
        return Action(episode_id=episode_id, text=text, tool_calls=parse_tool_calls(text), turn=turn)

    def start(self, episodes: list[pb.EpisodeStart], timeout_s: float | None = None) -> pb.StepResponse:
        return self.stub.Start(pb.StartRequest(episodes=episodes), timeout=timeout_s or self.timeout_s)

    def step(self, actions: list[Action]) -> pb.StepResponse:
        return self.stub.Step(env_convert.step_request(actions), timeout=self.timeout_s)

    def end(self, ids: list[str], reason: str = "max_turns") -> pb.StepResponse:
        return self.stub.End(pb.EndRequest(episode_ids=ids, reason=reason), timeout=self.timeout_s)

    def well_formed(self, ids: list[str], reply: pb.StepResponse, require_ok: bool = True) -> str:
        results = list(reply.results)
        if len(results) != len(ids):
            raise Failed(f"{len(results)} results for {len(ids)} episodes")
        for position, (episode_id, result) in enumerate(zip(ids, results)):
            if result.episode_id != episode_id:
                raise Failed(f"result {position} has episode_id {result.episode_id!r}, "
                             f"expected {episode_id!r}")
            if result.HasField("reward") and not math.isfinite(result.reward):
                raise Failed(f"episode {episode_id}: non-finite reward {result.reward}")
            if not result.ok and not result.error:
                raise Failed(f"episode {episode_id}: ok=false without an error message")
            if require_ok and not result.ok:
                raise Failed(f"episode {episode_id} failed: {result.error}")
        return f"{len(results)} result{'s' * (len(results) != 1)} in order"

    def play(self, count: int) -> tuple[list[str], list[pb.StepResult], int]:
        """Starts `count` episodes and plays them to done (ending those still running after MAX_TURNS).
        Returns their ids, their last results and the turns taken."""
        episodes = self.starts(count)
        ids = [e.episode_id for e in episodes]
        self.well_formed(ids, self.start(episodes))
        last: dict[str, pb.StepResult] = {}
        running, turn = list(ids), 0
        while running and turn < MAX_TURNS:
            turn += 1
            reply = self.step([self.action(i, turn) for i in running])
            self.well_formed(running, reply)
            for i, result in zip(running, reply.results):
                last[i] = result
            running = [i for i, r in zip(running, reply.results) if not r.done]
        if running:
            reply = self.end(running)
            self.well_formed(running, reply)
            last.update(zip(running, reply.results))
        return ids, [last[i] for i in ids], turn

    # ---- the checks, in order ---------------------------------------------------------------------
    def check_empty(self) -> str:
        for name, call in (("Start", lambda: self.start([])), ("Step", lambda: self.step([])),
                           ("End", lambda: self.end([]))):
            if call().results:
                raise Failed(f"{name} answered results for an empty request")
        return "0 results from Start, Step and End"

    def check_episode(self) -> str:
        _, [result], turns = self.play(1)
        reward = f"reward {result.reward:g}" if result.HasField("reward") else "no reward (scored elsewhere)"
        return f"{turns} turn{'s' * (turns != 1)}, {reward}"

    def check_batch(self) -> str:
        ids, results, turns = self.play(16)
        rewards = sum(r.HasField("reward") for r in results)
        return f"16 episodes in order over {turns} turns, {rewards} with a reward"

    def check_concurrent(self) -> str:
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda _: self.play(4), range(4)))
        return f"4 concurrent batches of {len(outcomes[0][0])} episodes played"

    def check_unknown_episode(self) -> str:
        reply = self.step([self.action("check-never-started", 1)])
        self.well_formed(["check-never-started"], reply, require_ok=False)
        result = reply.results[0]
        if result.ok:
            raise Failed("a Step of an episode never started answered ok=true")
        if "check-never-started" not in result.error:
            raise Failed(f"the error does not name the episode: {result.error!r}")
        return f"ok=false: {result.error}"[:90]

    def check_after_done(self) -> str:
        ids, results, _ = self.play(1)
        if not results[0].done:
            return "the episode never ended by itself; ended with End"
        reply = self.step([self.action(ids[0], MAX_TURNS + 1)])
        self.well_formed(ids, reply, require_ok=False)
        if reply.results[0].ok:
            raise Failed(f"episode {ids[0]}: a Step after done answered ok=true")
        return "a Step after done fails the episode (ok=false)"

    def check_end(self) -> str:
        episodes = self.starts(2)
        ids = [e.episode_id for e in episodes]
        self.well_formed(ids, self.start(episodes))
        detail = self.well_formed(ids, self.end(ids, "length"))
        again = self.end(ids[:1])
        self.well_formed(ids[:1], again, require_ok=False)
        if again.results[0].ok:
            raise Failed(f"episode {ids[0]}: a second End answered ok=true (it was over)")
        return f"{detail}; a second End fails"

    def check_deadline(self) -> str:
        episodes = self.starts(64)
        try:
            reply = self.start(episodes, timeout_s=0.001)
            outcome = f"answered within 1 ms ({self.well_formed([e.episode_id for e in episodes], reply)})"
            self.end([e.episode_id for e in episodes])
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Failed(f"a 1 ms deadline ended with {err.code().name}, not DEADLINE_EXCEEDED") from None
            outcome = "DEADLINE_EXCEEDED"
        self.play(2)
        return f"{outcome}; serves normally afterwards"

    def check_duplicate_ids(self) -> str:
        episodes = self.starts(2)
        episodes[1].episode_id = episodes[0].episode_id
        return self.expect_code(lambda: self.start(episodes), grpc.StatusCode.INVALID_ARGUMENT)

    def check_empty_id(self) -> str:
        return self.expect_code(lambda: self.start(self.starts(1, episode_id="")),
                                grpc.StatusCode.INVALID_ARGUMENT)

    def check_bad_extra_info(self) -> str:
        return self.expect_code(lambda: self.start(self.starts(1, extra_info_json="{not json")),
                                grpc.StatusCode.INVALID_ARGUMENT)

    def check_bad_arguments(self) -> str:
        request = pb.StepRequest(actions=[pb.Action(episode_id="check-bad-args", text="x", turn=1,
                                                    tool_calls=[pb.ToolCall(name="t",
                                                                            arguments_json="{oops")])])
        return self.expect_code(lambda: self.stub.Step(request, timeout=self.timeout_s),
                                grpc.StatusCode.INVALID_ARGUMENT)

    def check_recovers(self) -> str:
        _, results, turns = self.play(3)
        return f"3 episodes played ({turns} turns); {self.check_health()}"

    def check_describe(self) -> str:
        reply = self.optional("Describe",
                              lambda: self.stub.Describe(pb.DescribeRequest(), timeout=self.timeout_s))
        if reply is NA:
            return NA
        for tool in reply.tools:
            if tool.parameters_json:
                try:
                    json.loads(tool.parameters_json)
                except json.JSONDecodeError:
                    raise Failed(f"tool {tool.name!r}: parameters_json is not JSON") from None
        return f"name={reply.name or '-'} tools={[t.name for t in reply.tools]}"

    CHECKS = (
        ("health", ServerChecker.check_health), ("empty requests", check_empty),
        ("one episode", check_episode),
        ("batch keeps order", check_batch), ("concurrent calls", check_concurrent),
        ("unknown episode", check_unknown_episode), ("step after done", check_after_done),
        ("End", check_end), ("deadline", check_deadline),
        ("malformed: duplicate ids", check_duplicate_ids), ("malformed: empty id", check_empty_id),
        ("malformed: extra_info_json", check_bad_extra_info),
        ("malformed: arguments_json", check_bad_arguments), ("serves after errors", check_recovers),
        ("Describe (optional)", check_describe), ("reflection (optional)", ServerChecker.check_reflection),
    )


def format_table(address: str, checks: list[Check]) -> str:
    return conformance.format_table("environment", address, checks)


def check_server(address: str, timeout_s: float = 10.0, row: dict | None = None,
                 actions: list[str] | None = None, security=None) -> list[Check]:
    checker = EnvContractChecker(address, timeout_s, row, actions, security)
    try:
        return checker.run()
    finally:
        checker.close()


def parse_row(raw: str | None) -> dict | None:
    from rlfleet.errors import ConfigError

    if raw is None:
        return None
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--row {raw!r} is not JSON: {exc}") from None
    allowed = {"data_source", "prompt", "ground_truth", "extra_info_json"}
    if not isinstance(row, dict) or set(row) - allowed:
        raise ConfigError(f"--row must be a JSON object with keys among {sorted(allowed)}")
    return row
