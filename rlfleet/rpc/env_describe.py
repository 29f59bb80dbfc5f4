"""The tools an environment server describes (its optional Describe RPC), for the episode prompts."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import structlog

from rlfleet.config import EnvConfig
from rlfleet.env.tool_prompt import ToolPrompt, choose_tool_prompt
from rlfleet.env.types import ToolSpec
from rlfleet.errors import ConfigError, ServiceUnavailable
from rlfleet.proto.v1 import environment_pb2 as pb
from rlfleet.proto.v1 import environment_pb2_grpc
from rlfleet.rpc.channel import wait_until_serving
from rlfleet.rpc.env_convert import tools_from_proto
from rlfleet.rpc.security import Security

log = structlog.get_logger(__name__)


def describe_tools(address: str, timeout_s: float, connect_timeout_s: float, security: Security | None = None,
                   alive: Callable[[], bool] = lambda: True) -> tuple[ToolSpec, ...] | None:
    """The tools of the environment server at `address` once it serves (None: it implements no
    Describe). A server that cannot be reached, or fails Describe otherwise, raises
    ServiceUnavailable naming it and env.tools_in_prompt (false leaves the prompts as they are)."""
    channel = wait_until_serving(address, "environment", connect_timeout_s, alive, security)
    try:
        stub = environment_pb2_grpc.EnvironmentStub(channel)
        reply = stub.Describe(pb.DescribeRequest(), timeout=timeout_s)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            return None
        raise ServiceUnavailable(f"environment {address}: Describe failed with {err.code().name}: "
                                 f"{err.details()} (its tools go into the prompts; env.tools_in_prompt=false "
                                 "leaves them out)") from None
    finally:
        channel.close()
    return tools_from_proto(reply.tools, address)


def job_tool_prompt(env: EnvConfig, connect_timeout_s: float, tokenizer: Any,
                    security: Security | None = None,
                    alive: Callable[[], bool] = lambda: True) -> ToolPrompt | None:
    """How the episode prompts get the environment's tools (env.tools_in_prompt), asked of the
    server at env.address; None: prompts as the data set has them (no environment, no tools, off)."""
    if not env.enabled or env.tools_in_prompt is False:
        return None
    if not env.address:  # env.name alone: served by `rlfleet run`, which sets the address first
        if env.tools_in_prompt is True:
            raise ConfigError(f"env.tools_in_prompt=true needs the environment's address to ask its tools: "
                              f"env.name={env.name!r} without env.address")
        return None
    if env.kind == "openenv":  # the action schema's tool, or the MCP tools; none for a text action
        from rlfleet.rpc.openenv_wire import fetch_action_spec, wait_until_healthy

        spec = fetch_action_spec(wait_until_healthy(env.address, connect_timeout_s, alive), env.timeout_s)
        specs: tuple[ToolSpec, ...] | None = spec.tools or None
    else:
        specs = describe_tools(env.address, env.timeout_s, connect_timeout_s, security, alive)
    tool_prompt = choose_tool_prompt(env.tools_in_prompt, specs, tokenizer, env.address)
    if tool_prompt is not None:
        log.info("environment tools in the prompts", tools=tool_prompt.summary())
    return tool_prompt
