"""The mapping between an OpenEnv server's episodes and rlfleet's (env.kind=openenv). Pure: no network.

An OpenEnv server (HTTP/WebSocket, `openenv-core`'s server helpers or any implementation of the
same wire format) plays one episode per WebSocket session: `reset` gives the first observation,
each `step` takes one action and answers {observation, reward, done}. rlfleet maps:

    data row     -> reset's keyword arguments: episode_id, data_source, prompt, ground_truth,
                    extra_info (the server's reset() takes those it names, OpenEnv drops the rest)
    model turn   -> one step, whose action depends on the action schema (/schema):
        text     the action has one string field to fill (required, or the only one; e.g.
                 `message`): it gets the reply text, as it is.
        mcp      the action is MCP's CallToolAction (fields tool_name, arguments): the server's MCP
                 tools (tools/list) are offered to the model as tools, and its tool call becomes
                 {type: call_tool, tool_name, arguments}.
        typed    any other action: offered to the model as one tool, named after the action (the
                 schema's title), whose arguments are the action's fields; its call's arguments
                 become the action.
                 A tool-mode reply with no usable call is not sent: the model is told so (one tool
                 error), and so is an action the server rejects as invalid (VALIDATION_ERROR).
    observation  -> what the model sees next: the observation's fields without reward, done and
                    metadata; one non-empty string field is shown as it is, several fields as JSON
                    (empty: nothing shown); an MCP call's answer is its result's text (or "error: …",
                    a tool error). A user message in text mode, a tool message otherwise.
    reward       -> env.reward: sum (of the steps' rewards), last (the last one given), or service
                    (none: the reward service scores the final turn, as for a tool environment).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rlfleet.env.types import Action, EpisodeRow, Message, Observation, ToolSpec

TEXT, TYPED, MCP = "text", "typed", "mcp"
BASE_FIELDS = ("metadata",)  # fields of OpenEnv's Action base class, never filled by the model
REWARD_MODES = ("sum", "last", "service")


class BadReply(ValueError):
    """A reply that breaks OpenEnv's wire format."""


@dataclass(frozen=True)
class Endpoint:
    """Where an OpenEnv server answers: its HTTP base (health, schema) and its WebSocket (episodes)."""

    http: str
    ws: str

    @classmethod
    def parse(cls, address: str) -> Endpoint:
        """http(s)://HOST:PORT[/prefix], ws(s)://HOST:PORT[/prefix][/ws], or HOST:PORT (plain HTTP)."""
        text = address.strip()
        if "://" not in text:
            text = "http://" + text
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            raise ValueError(f"env.address={address!r}: an OpenEnv server is http://HOST:PORT or ws://HOST:PORT")
        secure = parts.scheme in ("https", "wss")
        path = parts.path.rstrip("/")
        if path.endswith("/ws"):
            path = path[:-3]
        http = urlunsplit(("https" if secure else "http", parts.netloc, path, "", ""))
        ws = urlunsplit(("wss" if secure else "ws", parts.netloc, path + "/ws", "", ""))
        return cls(http=http, ws=ws)


@dataclass(frozen=True)
class ActionSpec:
    """How a model turn becomes an action, from the server's action schema."""

    mode: str
    text_field: str = ""
    tools: tuple[ToolSpec, ...] = ()
    schema_title: str = ""

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)


def _fields(schema: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    properties = {k: v for k, v in (schema.get("properties") or {}).items() if k not in BASE_FIELDS}
    required = [k for k in schema.get("required") or [] if k in properties]
    return properties, required


def is_mcp(schema: dict[str, Any]) -> bool:
    properties, _ = _fields(schema)
    return {"tool_name", "arguments"} <= set(properties)


def action_spec(schema: dict[str, Any], mcp_tools: tuple[ToolSpec, ...] = ()) -> ActionSpec:
    """The mapping for an action JSON schema (/schema's `action`); `mcp_tools`: the server's tools
    when the action is MCP's (ask is_mcp first)."""
    if not isinstance(schema, dict):
        raise BadReply(f"the action schema is a {type(schema).__name__}, not a JSON schema object")
    title = str(schema.get("title") or "action")
    properties, required = _fields(schema)
    if is_mcp(schema):
        if not mcp_tools:
            raise BadReply("the action is MCP's CallToolAction but the server lists no tools (tools/list)")
        return ActionSpec(MCP, tools=mcp_tools, schema_title=title)
    if not properties:
        raise BadReply(f"the action schema {title!r} has no field the model could fill")
    strings = [k for k, v in properties.items() if v.get("type") == "string"]
    text_field = (required[0] if len(required) == 1 and required[0] in strings
                  else strings[0] if not required and len(properties) == 1 and strings else "")
    if text_field:
        return ActionSpec(TEXT, text_field=text_field, schema_title=title)
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if "$defs" in schema:
        parameters["$defs"] = schema["$defs"]
    tool = ToolSpec(name=title, description=str(schema.get("description") or f"Take one {title}."),
                    parameters=parameters)
    return ActionSpec(TYPED, tools=(tool,), schema_title=title)


def mcp_tools_of(reply: Any) -> tuple[ToolSpec, ...]:
    """ToolSpecs from an MCP tools/list JSON-RPC reply."""
    if not isinstance(reply, dict) or "error" in reply and reply["error"]:
        raise BadReply(f"tools/list failed: {reply.get('error') if isinstance(reply, dict) else reply!r}")
    tools = (reply.get("result") or {}).get("tools")
    if not isinstance(tools, list):
        raise BadReply("tools/list answered no list of tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadReply(f"tools/list: a tool without a name: {tool!r}"[:300])
        out.append(ToolSpec(name=tool["name"], description=str(tool.get("description") or ""),
                            parameters=tool.get("inputSchema") or tool.get("input_schema") or {}))
    return tuple(out)


def reset_arguments(row: EpisodeRow) -> dict[str, Any]:
    return {"episode_id": row.episode_id, "data_source": row.data_source, "prompt": row.prompt,
            "ground_truth": row.ground_truth, "extra_info": dict(row.extra_info)}


@dataclass(frozen=True)
class ActionOrError:
    """What a model turn gives: the action to send, or the tool error the model is told instead."""

    action: dict[str, Any] | None = None
    error: str = ""


def build_action(spec: ActionSpec, turn: Action) -> ActionOrError:
    if spec.mode == TEXT:
        return ActionOrError(action={spec.text_field: turn.text})
    call = next((c for c in turn.tool_calls if c.name in spec.tool_names), None)
    if call is None:
        named = f" (called {', '.join(repr(c.name) for c in turn.tool_calls)})" if turn.tool_calls else ""
        return ActionOrError(error=f"error: no call to a tool{named}; call one of "
                                   f"{', '.join(spec.tool_names)} to act")
    arguments = call.arguments
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return ActionOrError(error=f"error: the arguments of {call.name} are not a JSON object")
    if not isinstance(arguments, dict):
        return ActionOrError(error=f"error: the arguments of {call.name} are not a JSON object")
    if spec.mode == MCP:
        return ActionOrError(action={"type": "call_tool", "tool_name": call.name, "arguments": arguments})
    return ActionOrError(action=dict(arguments))


@dataclass(frozen=True)
class Answer:
    """One observation reply: what the model sees, the step's reward, done."""

    observation: Observation
    reward: float | None
    done: bool
    fields: dict[str, Any] = field(default_factory=dict)
    tool_error: bool = False


def observation_text(fields: dict[str, Any]) -> str:
    shown = {k: v for k, v in fields.items() if v not in (None, "", [], {})}
    if len(shown) == 1 and isinstance(next(iter(shown.values())), str):
        return next(iter(shown.values()))
    return json.dumps(shown, sort_keys=True, default=str) if shown else ""


def mcp_result_text(fields: dict[str, Any]) -> tuple[str, bool]:
    """An MCP tool call's observation (CallToolObservation: tool_name, result, error) as the model sees
    it: the result's text content (else its data, else the whole result), or "error: …"; and whether
    it is a tool error."""
    error = fields.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        return f"error: {message}", True
    result = fields.get("result")
    if isinstance(result, dict):
        texts = [c.get("text") for c in result.get("content") or [] if isinstance(c, dict) and c.get("text")]
        if texts:
            return "\n".join(texts), bool(result.get("is_error") or result.get("isError"))
        if result.get("data") is not None:
            result = result["data"]
    return (result if isinstance(result, str) else json.dumps(result, default=str)), False


def parse_answer(message: Any, role: str, mcp: bool = False) -> Answer:
    """A `{"type": "observation", "data": {observation, reward, done}}` reply (else BadReply); `mcp`:
    the answer to an MCP tool call."""
    data = message.get("data") if isinstance(message, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("observation"), dict):
        raise BadReply(f"expected {{type: observation, data: {{observation: {{...}}, reward, done}}}}, "
                       f"got {json.dumps(message, default=str)[:200]}")
    reward, done = data.get("reward"), data.get("done", False)
    if reward is not None and (isinstance(reward, str) or not isinstance(reward, (int, float))):
        raise BadReply(f"reward {reward!r} is not a number")
    if reward is not None and not math.isfinite(float(reward)):
        raise BadReply(f"the non-finite reward {reward}")
    if not isinstance(done, bool):
        raise BadReply(f"done {done!r} is not a boolean")
    tool_error = False
    if mcp and ("result" in data["observation"] or data["observation"].get("error")):
        text, tool_error = mcp_result_text(data["observation"])
    else:
        text = observation_text(data["observation"])
    observation = Observation(messages=(Message(role, text),)) if text else Observation()
    return Answer(observation, None if reward is None else float(reward), done, data["observation"],
                  tool_error)


class RewardTally:
    """The episode reward the rollout is told after each step (env.reward)."""

    def __init__(self, mode: str):
        if mode not in REWARD_MODES:
            raise ValueError(f"env.reward={mode!r}: one of {', '.join(REWARD_MODES)}")
        self.mode = mode
        self.total: float | None = None
        self.last: float | None = None

    def add(self, reward: float | None) -> float | None:
        if reward is not None:
            self.total = reward if self.total is None else self.total + reward
            self.last = reward
        return self.value

    @property
    def value(self) -> float | None:
        return {"sum": self.total, "last": self.last, "service": None}[self.mode]
