"""`rlfleet env check ADDRESS`: does an environment server keep the rlfleet.v1.Environment contract?

Each check is one small conversation with the server; the result is PASS, WARN (an older revision's
behaviour the rollout copes with: exit 0), FAIL (the contract is broken; the detail says how) or N/A
(an optional part the server does not implement). Episodes
start from a digits row by default and are played with a tool call, then a plain answer; a server
for other data takes `--row '{"data_source": …, "prompt": …, "ground_truth": …}'` and
`--action TEXT` (repeatable: the turns played, in order, cycling).

Besides the contract's rules it checks the points environment.proto decides (revision 2): a Start of
an episode still running fails that item and leaves the episode running, Start answers done=false and
no reward, an observation is messages or text (not both), an empty `arguments_json` is a call without
arguments (not INVALID_ARGUMENT), the End reasons, an End after a failed call is answered; and the
health service's Watch. Where a server keeps an older revision's behaviour that the rollout copes with
(it never reuses an id nor sends an empty arguments_json, it ignores a reward on Start and uses the
text of an observation with both fields) the check says WARN, naming the revision that changed the
point; it prints the contract revision the server reports in Describe (rlfleet/env/contract.py).
With a bearer token (`--config`) it checks that calls without it, or with another, are refused
UNAUTHENTICATED; with `--stop PID` it ends by sending the server SIGTERM and checks that health
says NOT_SERVING before the server goes. Episode ids carry a random tag per check, so that checking
one server again never reuses an id.
"""
from __future__ import annotations

import json
import math
import secrets
from concurrent.futures import ThreadPoolExecutor

import grpc

from rlfleet.env.contract import CONTRACT_REVISION, DECIDED, since
from rlfleet.env.toolcalls import parse_tool_calls
from rlfleet.env.types import Action
from rlfleet.proto.v1 import environment_pb2 as pb
from rlfleet.proto.v1 import environment_pb2_grpc
from rlfleet.rpc import env_convert
from rlfleet.app import conformance
from rlfleet.app.env_service_checks import ServiceChecks
from rlfleet.app.conformance import (  # noqa: F401 (re-exported)
    FAIL,
    NA,
    PASS,
    WARN,
    Check,
    Failed,
    NotApplicable,
    ServerChecker,
)

ENV_SERVICE = "rlfleet.v1.Environment"
DEFAULT_ROW = {"data_source": "digits_reverse", "prompt": "Reverse the digits: 4721", "ground_truth": "1274"}
DEFAULT_ACTIONS = ['Let me check. <tool name="calculator">6*7</tool>', "1274"]
MAX_TURNS = 8


class EnvContractChecker(ServiceChecks, ServerChecker):
    SERVICE = ENV_SERVICE

    def __init__(self, address: str, timeout_s: float = 10.0, row: dict | None = None,
                 actions: list[str] | None = None, security=None, stop_pid: int | None = None):
        """`security`: TLS and bearer token to reach a secured server (rlfleet.rpc.security.Security).
        `stop_pid`: the server's process, sent SIGTERM by the last check (None: that check is N/A)."""
        super().__init__(address, timeout_s, security)
        self.security, self.stop_pid = security, stop_pid
        self.row = row or DEFAULT_ROW
        self.actions = actions or DEFAULT_ACTIONS
        self.stub = environment_pb2_grpc.EnvironmentStub(self.channel)
        self._ids = 0
        self._tag = secrets.token_hex(4)  # ids never repeat across checks of one server

    # ---- requests ---------------------------------------------------------------------------------
    def starts(self, count: int, **override: str) -> list[pb.EpisodeStart]:
        out = []
        for _ in range(count):
            self._ids += 1
            fields = {"episode_id": f"check-{self._tag}-{self._ids}", "data_source": "", "prompt": "",
                      "ground_truth": "", "extra_info_json": "", **self.row, **override}
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
            if result.observation.messages and result.observation.text:
                self.warn(f"an observation with both messages and text: the rollout uses the text "
                          f"({since(DECIDED)}; revision 1 used the messages); send one or the other")
            if require_ok and not result.ok:
                raise Failed(f"episode {episode_id} failed: {result.error}")
        return f"{len(results)} result{'s' * (len(results) != 1)} in order"

    def started(self, ids: list[str], reply: pb.StepResponse) -> str:
        """A Start reply: well formed, every episode running (done=false) and no reward."""
        detail = self.well_formed(ids, reply)
        for episode_id, result in zip(ids, reply.results):
            if result.done:
                raise Failed(f"episode {episode_id}: Start answered done=true (an episode needs a turn)")
            if result.HasField("reward"):
                self.warn(f"Start answered a reward: ignored, there is no turn to reward ({since(DECIDED)}: "
                          "Start answers no reward)")
        return detail

    def play(self, count: int) -> tuple[list[str], list[pb.StepResult], int]:
        """Starts `count` episodes and plays them to done (ending those still running after MAX_TURNS).
        Returns their ids, their last results and the turns taken."""
        episodes = self.starts(count)
        ids = [e.episode_id for e in episodes]
        self.started(ids, self.start(episodes))
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
        reply = self.end(ids, "length")
        detail = self.well_formed(ids, reply, require_ok=False)
        refused = [r for r in reply.results if not r.ok]
        if refused:
            raise Failed(f"End(reason='length') answered ok=false ({refused[0].error}): {since(DECIDED)} "
                         "renamed the End reasons (max_turns, length, failed, aborted; token_budget is now "
                         "length, generation_failed failed or aborted), and a refused End fails the episode")
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
            # As the rollout does after a failed call: End(failed), answered for each episode
            # (ok=false for one the server never started or forgot is fine).
            ids = [e.episode_id for e in episodes]
            self.well_formed(ids, self.end(ids, "failed"), require_ok=False)
            outcome += ", End(failed) answered"
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

    def check_running_id(self) -> str:
        episodes = self.starts(1)
        [episode_id] = [e.episode_id for e in episodes]
        self.started([episode_id], self.start(episodes))
        again = self.start(self.starts(1, episode_id=episode_id))
        self.well_formed([episode_id], again, require_ok=False)
        if again.results[0].ok:  # revision 1 left it open (servers started the episode afresh)
            self.warn(f"a second Start of the running episode {episode_id} answered ok=true: "
                      f"{since(DECIDED)} refuses it (ok=false naming the episode) and leaves the episode as "
                      "it is; harmless to the rollout, which never reuses an id")
        elif episode_id not in again.results[0].error:
            raise Failed(f"the error does not name the episode: {again.results[0].error!r}")
        step = self.step([self.action(episode_id, 1)])
        self.well_formed([episode_id], step, require_ok=False)
        if not step.results[0].ok:
            raise Failed(f"episode {episode_id}: no longer running after the refused Start: "
                         f"{step.results[0].error}")
        if not step.results[0].done:
            self.end([episode_id])
        return "a second Start fails (ok=false) and the episode plays on"

    def check_empty_arguments(self) -> str:
        episodes = self.starts(1)
        [episode_id] = [e.episode_id for e in episodes]
        self.started([episode_id], self.start(episodes))
        name = "calculator"
        describe = self.optional("Describe", lambda: self.stub.Describe(pb.DescribeRequest(),
                                                                        timeout=self.timeout_s))
        if describe is not NA and describe.tools:
            name = describe.tools[0].name
        request = pb.StepRequest(actions=[pb.Action(episode_id=episode_id, text="x", turn=1,
                                                    tool_calls=[pb.ToolCall(name=name, arguments_json="")])])
        try:
            reply = self.stub.Step(request, timeout=self.timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise Failed(f"a tool call with an empty arguments_json (no arguments) ended "
                             f"{err.code().name}: {err.details()}") from None
            self.warn(f"a tool call with an empty arguments_json ended INVALID_ARGUMENT: {since(DECIDED)} "
                      "reads it as a call without arguments ({}); harmless to the rollout, which always "
                      "sends JSON")
            self.end([episode_id])
            return "INVALID_ARGUMENT"
        self.well_formed([episode_id], reply, require_ok=False)
        if reply.results[0].ok and not reply.results[0].done:
            self.end([episode_id])
        return f"answered ({'ok' if reply.results[0].ok else 'ok=false'})"

    def check_recovers(self) -> str:
        _, results, turns = self.play(3)
        return f"3 episodes played ({turns} turns); {self.check_health()}"

    CHECKS = (
        ("health", ServerChecker.check_health), ("health Watch", ServiceChecks.check_health_watch),
        ("contract revision", ServiceChecks.check_revision),
        ("empty requests", check_empty),
        ("one episode", check_episode),
        ("batch keeps order", check_batch), ("concurrent calls", check_concurrent),
        ("unknown episode", check_unknown_episode), ("step after done", check_after_done),
        ("End", check_end), ("deadline", check_deadline),
        ("malformed: duplicate ids", check_duplicate_ids), ("malformed: empty id", check_empty_id),
        ("malformed: extra_info_json", check_bad_extra_info),
        ("malformed: arguments_json", check_bad_arguments),
        ("Start of a running episode", check_running_id), ("empty arguments_json", check_empty_arguments),
        ("serves after errors", check_recovers),
        ("Describe (optional)", ServiceChecks.check_describe),
        ("reflection (optional)", ServerChecker.check_reflection),
        ("token refused (with a token)", ServiceChecks.check_token_refused),
        ("NOT_SERVING on SIGTERM (--stop)", ServiceChecks.check_shutdown),
    )


def format_table(address: str, checks: list[Check]) -> str:
    return conformance.format_table("environment", address, checks,
                                    against=f"contract revision {CONTRACT_REVISION}")


def check_server(address: str, timeout_s: float = 10.0, row: dict | None = None,
                 actions: list[str] | None = None, security=None, stop_pid: int | None = None) -> list[Check]:
    checker = EnvContractChecker(address, timeout_s, row, actions, security, stop_pid)
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
