"""environment.proto <-> rlfleet.env.types, for both sides of the contract."""
from __future__ import annotations

import json

from rlfleet.env.types import Action, EpisodeRow, Message, Observation, StepResult, ToolCall, ToolSpec
from rlfleet.errors import InvalidRequest
from rlfleet.proto.v1 import environment_pb2 as pb
from rlfleet.rpc.convert import json_object


def start_request(rows: list[EpisodeRow]) -> pb.StartRequest:
    return pb.StartRequest(episodes=[
        pb.EpisodeStart(episode_id=r.episode_id, data_source=r.data_source, prompt=r.prompt,
                        ground_truth=r.ground_truth,
                        extra_info_json=json.dumps(r.extra_info) if r.extra_info else "")
        for r in rows])


def rows_from_proto(msg: pb.StartRequest) -> list[EpisodeRow]:
    check_ids([e.episode_id for e in msg.episodes])
    return [EpisodeRow(episode_id=e.episode_id, data_source=e.data_source, prompt=e.prompt,
                       ground_truth=e.ground_truth,
                       extra_info=json_object(e.extra_info_json, f"episode {e.episode_id}: extra_info_json"))
            for e in msg.episodes]


def step_request(actions: list[Action]) -> pb.StepRequest:
    return pb.StepRequest(actions=[
        pb.Action(episode_id=a.episode_id, text=a.text, turn=a.turn, truncated=a.truncated,
                  tool_calls=[pb.ToolCall(name=c.name, arguments_json=json.dumps(c.arguments))
                              for c in a.tool_calls])
        for a in actions])


def actions_from_proto(msg: pb.StepRequest) -> list[Action]:
    check_ids([a.episode_id for a in msg.actions])
    actions = []
    for a in msg.actions:
        calls = []
        for c in a.tool_calls:
            try:
                # empty: a call without arguments (the contract reads it as the empty object)
                arguments = json.loads(c.arguments_json) if c.arguments_json else {}
            except json.JSONDecodeError as exc:
                raise InvalidRequest(f"episode {a.episode_id}: tool call {c.name!r}: arguments_json is not "
                                     f"JSON: {exc}") from None
            calls.append(ToolCall(c.name, arguments))
        actions.append(Action(episode_id=a.episode_id, text=a.text, tool_calls=tuple(calls), turn=a.turn,
                              truncated=a.truncated))
    return actions


def end_request(episode_ids: list[str], reason: str) -> pb.EndRequest:
    return pb.EndRequest(episode_ids=episode_ids, reason=reason)


def end_ids_from_proto(msg: pb.EndRequest) -> list[str]:
    check_ids(list(msg.episode_ids))
    return list(msg.episode_ids)


def check_ids(ids: list[str]) -> None:
    seen = set()
    for position, episode_id in enumerate(ids):
        if not episode_id:
            raise InvalidRequest(f"item {position}: episode_id is empty")
        if episode_id in seen:
            raise InvalidRequest(f"episode_id {episode_id!r} appears twice in one request")
        seen.add(episode_id)


def observation_to_proto(o: Observation) -> pb.Observation:
    messages = [pb.Message(role=m.role, content=m.content, name=m.name) for m in o.messages]
    return pb.Observation(messages=messages, text=o.text)


def result_to_proto(r: StepResult) -> pb.StepResult:
    return pb.StepResult(episode_id=r.episode_id, ok=r.ok, error=r.error,
                         observation=observation_to_proto(r.observation), reward=r.reward, done=r.done,
                         tool_errors=r.tool_errors, metrics=r.metrics)


def result_from_proto(msg: pb.StepResult) -> StepResult:
    obs = Observation(messages=tuple(Message(m.role, m.content, m.name) for m in msg.observation.messages),
                      text=msg.observation.text)
    return StepResult(episode_id=msg.episode_id, observation=obs,
                      reward=msg.reward if msg.HasField("reward") else None, done=msg.done,
                      tool_errors=msg.tool_errors, ok=msg.ok, error=msg.error, metrics=dict(msg.metrics))


def tools_to_proto(tools: tuple[ToolSpec, ...]) -> list[pb.ToolSpec]:
    return [pb.ToolSpec(name=t.name, description=t.description,
                        parameters_json=json.dumps(t.parameters) if t.parameters else "") for t in tools]


def tools_from_proto(tools, address: str) -> tuple[ToolSpec, ...]:
    """The tools of a Describe reply; a parameters_json that is no JSON object is an error naming the tool."""
    out = []
    for t in tools:
        parameters = json_object(t.parameters_json, f"environment {address}: tool {t.name!r} parameters_json")
        out.append(ToolSpec(name=t.name, description=t.description, parameters=parameters))
    return tuple(out)
