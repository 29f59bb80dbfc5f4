"""Real environment servers that break the contract on purpose (the Python SDK's servicer refuses to).

`FaultyEnvironment` is an `rlfleet.v1.Environment` servicer on a real server (health says SERVING,
reflection on) whose fault a test picks:

    nan_reward    Start answers, every Step answers reward NaN (a reply that breaks the contract)
    unavailable   every call ends UNAVAILABLE while health says SERVING
    honest        Start answers, Step ends the episode with reward 1 (the control)
    lax_ids       accepts a second Start of a running episode, refuses an empty arguments_json
                  (INVALID_ARGUMENT)
    lax_start     Start answers a reward
    both_obs      Step answers an observation with both messages and text
    hang          Start answers, Step never answers (it holds the call until the caller gives up)

It records the calls it was sent (`calls`: (rpc, episode ids, End's reason)).

`Revision1Environment` is a server written against the contract's first text (revision 1, before
the decided points of revision 2: docs/environments.md#contract-revisions), correct in everything
else: a second Start of a running episode starts it afresh, Start answers a reward (0), the first
turn's observation carries both messages and text (messages won then), an empty arguments_json is
not JSON (INVALID_ARGUMENT). With `end_reasons` it also knows only revision 1's End reasons
(max_turns, token_budget, generation_failed) and refuses another (ok=false).

    python -m tests.env_servers --fault nan_reward --port 0    # prints "serving on HOST:PORT"
"""
from __future__ import annotations

import argparse
import json
import math
import threading

import grpc

from rlfleet.proto.v1 import environment_pb2 as pb
from rlfleet.proto.v1 import environment_pb2_grpc
from rlfleet.rpc.server import ServiceServer

SERVICE = "rlfleet.v1.Environment"
FAULTS = ("nan_reward", "unavailable", "honest", "lax_ids", "lax_start", "both_obs", "hang")


class FaultyEnvironment(environment_pb2_grpc.EnvironmentServicer):
    def __init__(self, fault: str):
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault = fault
        self.calls: list[tuple[str, tuple[str, ...], str]] = []
        self._lock = threading.Lock()

    def _record(self, rpc: str, ids, reason: str = "") -> None:
        with self._lock:
            self.calls.append((rpc, tuple(ids), reason))

    def Start(self, request, context):
        self._record("Start", [e.episode_id for e in request.episodes])
        if self.fault == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "configured to be unavailable")
        if self.fault == "lax_start":
            return pb.StepResponse(results=[pb.StepResult(episode_id=e.episode_id, ok=True, reward=0.0)
                                            for e in request.episodes])
        return pb.StepResponse(results=[pb.StepResult(episode_id=e.episode_id, ok=True)
                                        for e in request.episodes])

    def Step(self, request, context):
        self._record("Step", [a.episode_id for a in request.actions])
        if self.fault == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "configured to be unavailable")
        if self.fault == "hang":  # answers nothing: the call ends when the caller's deadline cancels it
            while context.is_active():
                threading.Event().wait(0.2)
            return pb.StepResponse()
        calls = [c for a in request.actions for c in a.tool_calls]
        if self.fault == "lax_ids" and any(not c.arguments_json for c in calls):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "arguments_json is empty")
        if self.fault == "both_obs":
            both = pb.Observation(messages=[pb.Message(role="user", content="again")], text="again")
            return pb.StepResponse(results=[pb.StepResult(episode_id=a.episode_id, ok=True, observation=both)
                                            for a in request.actions])
        reward = math.nan if self.fault == "nan_reward" else 1.0
        return pb.StepResponse(results=[pb.StepResult(episode_id=a.episode_id, ok=True, done=True,
                                                      reward=reward) for a in request.actions])

    def End(self, request, context):
        self._record("End", request.episode_ids, request.reason)
        if self.fault == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "configured to be unavailable")
        return pb.StepResponse(results=[pb.StepResult(episode_id=i, ok=True, done=True)
                                        for i in request.episode_ids])


REVISION_1_END_REASONS = ("max_turns", "token_budget", "generation_failed")


class Revision1Environment(environment_pb2_grpc.EnvironmentServicer):
    def __init__(self, end_reasons: bool = False):
        self.end_reasons = end_reasons
        self._turns: dict[str, int] = {}  # running episodes: turns taken
        self._lock = threading.Lock()

    @staticmethod
    def _refuse_malformed(ids: list[str], context) -> None:
        if any(not i for i in ids) or len(set(ids)) != len(ids):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty or duplicate episode_id")

    def Start(self, request, context):
        self._refuse_malformed([e.episode_id for e in request.episodes], context)
        for e in request.episodes:
            if e.extra_info_json:
                try:
                    json.loads(e.extra_info_json)
                except ValueError:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{e.episode_id}: extra_info_json")
        with self._lock:
            for e in request.episodes:
                self._turns[e.episode_id] = 0  # a running episode named again starts afresh
        return pb.StepResponse(results=[pb.StepResult(episode_id=e.episode_id, ok=True, reward=0.0)
                                        for e in request.episodes])

    def Step(self, request, context):
        self._refuse_malformed([a.episode_id for a in request.actions], context)
        for c in (c for a in request.actions for c in a.tool_calls):
            try:
                json.loads(c.arguments_json)  # revision 1: a JSON value (an empty string is none)
            except ValueError:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"tool {c.name}: arguments_json is not JSON")
        results = []
        with self._lock:
            for a in request.actions:
                if a.episode_id not in self._turns:
                    results.append(pb.StepResult(episode_id=a.episode_id, ok=False,
                                                 error=f"episode {a.episode_id} is not running"))
                    continue
                self._turns[a.episode_id] += 1
                if self._turns[a.episode_id] == 1:
                    both = pb.Observation(messages=[pb.Message(role="user", content="again")], text="again")
                    results.append(pb.StepResult(episode_id=a.episode_id, ok=True, observation=both))
                else:
                    del self._turns[a.episode_id]
                    results.append(pb.StepResult(episode_id=a.episode_id, ok=True, done=True, reward=1.0))
        return pb.StepResponse(results=results)

    def End(self, request, context):
        results = []
        with self._lock:
            for i in request.episode_ids:
                if self.end_reasons and request.reason not in REVISION_1_END_REASONS:
                    results.append(pb.StepResult(episode_id=i, ok=False,
                                                 error=f"episode {i}: unknown End reason {request.reason!r}"))
                elif self._turns.pop(i, None) is None:
                    results.append(pb.StepResult(episode_id=i, ok=False, error=f"episode {i} is not running"))
                else:
                    results.append(pb.StepResult(episode_id=i, ok=True, done=True))
        return pb.StepResponse(results=results)


def start_revision_1(end_reasons: bool = False) -> ServiceServer:
    """A Revision1Environment on a real server (health SERVING, reflection on), on a free port."""
    server = ServiceServer([SERVICE], "127.0.0.1", 0)
    server.add(environment_pb2_grpc.add_EnvironmentServicer_to_server, Revision1Environment(end_reasons))
    server.start()
    server.mark_serving()
    return server


def start(fault: str, host: str = "127.0.0.1", port: int = 0) -> tuple[ServiceServer, FaultyEnvironment]:
    servicer = FaultyEnvironment(fault)
    server = ServiceServer([SERVICE], host, port)
    server.add(environment_pb2_grpc.add_EnvironmentServicer_to_server, servicer)
    server.start()
    server.mark_serving()
    return server, servicer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=FAULTS, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server, _ = start(args.fault, port=args.port)
    server.install_signal_handlers()
    print(f"serving on {server.address}", flush=True)
    server.wait()


if __name__ == "__main__":
    main()
