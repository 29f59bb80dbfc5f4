"""OpenEnv's wire (env.kind=openenv): HTTP GETs (/health, /schema) and one WebSocket session per
episode (/ws), as OpenEnv's own client speaks it. Failures are typed by cause, as the gRPC
environment client's are (rlfleet.env.types.FAILURE_CAUSES):

    Unreachable  the server cannot be reached, or the session's connection dropped  -> unavailable
    TimedOut     no answer within the deadline                                         -> timeout
    BadReply     an answer that is not OpenEnv's format (rlfleet.env.openenv)           -> invalid_reply
    ServerError  the server answered {type: error} (its code and message)               -> episode_error

`websockets` comes with the extra rlfleet[envs]; it is imported when a session opens.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from rlfleet.env.openenv import ActionSpec, BadReply, Endpoint, action_spec, is_mcp, mcp_tools_of
from rlfleet.errors import ConfigError, ServiceUnavailable

VALIDATION_ERROR, CAPACITY_REACHED = "VALIDATION_ERROR", "CAPACITY_REACHED"
MAX_MESSAGE_BYTES = 64 << 20
REPORT_EVERY_S = 5.0  # how often a wait says what it waits for, as rlfleet.rpc.channel's does


class Unreachable(ConnectionError):
    pass


class TimedOut(TimeoutError):
    pass


class ServerError(RuntimeError):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def get_json(url: str, timeout_s: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 - http(s) only
            body = reply.read()
    except urllib.error.HTTPError as err:
        raise BadReply(f"GET {url}: HTTP {err.code}") from None
    except TimeoutError:
        raise TimedOut(f"GET {url}: no answer within {timeout_s:g}s") from None
    except (urllib.error.URLError, OSError) as err:
        raise Unreachable(f"GET {url}: {getattr(err, 'reason', err)}") from None
    try:
        return json.loads(body)
    except ValueError:
        raise BadReply(f"GET {url}: not JSON: {body[:120]!r}") from None


def health_problem(endpoint: Endpoint, timeout_s: float = 5.0) -> str | None:
    """Why /health does not answer {status: healthy} (`GET URL: [Errno 111] Connection refused`, an HTTP
    status, the answer), or None when it does."""
    try:
        reply = get_json(endpoint.http + "/health", timeout_s)
    except (Unreachable, TimedOut, BadReply) as err:
        return str(err)
    if isinstance(reply, dict) and reply.get("status") == "healthy":
        return None
    return f"GET {endpoint.http}/health answered {json.dumps(reply)[:120]}, not {{status: healthy}}"


def healthy(endpoint: Endpoint, timeout_s: float = 5.0) -> bool:
    """/health answers {status: healthy}."""
    return health_problem(endpoint, timeout_s) is None


def wait_until_healthy(address: str, timeout_s: float, alive: Callable[[], bool] = lambda: True,
                       report_every_s: float = REPORT_EVERY_S) -> Endpoint:
    """The server's Endpoint once /health says healthy; ServiceUnavailable naming it and the last reason
    after `timeout_s`. Says every `report_every_s` (on stderr) what it waits for and why, as the wait
    for a gRPC service does (rlfleet.rpc.channel)."""
    endpoint = endpoint_of(address)
    start = time.monotonic()
    deadline, next_report = start + timeout_s, start + min(report_every_s, 3.0)
    while (why := health_problem(endpoint, min(5.0, timeout_s))) is not None:
        now = time.monotonic()
        if now > deadline or not alive():
            raise ServiceUnavailable(f"OpenEnv server {address} did not answer healthy within {timeout_s:g}s "
                                     f"(env.address, env.kind=openenv): {why}")
        if now >= next_report:
            print(f"rlfleet: waiting for the OpenEnv server at {address}: {why} ({now - start:.0f}s of "
                  f"{timeout_s:g}s)", file=sys.stderr, flush=True)
            next_report = now + report_every_s
        time.sleep(0.5)
    return endpoint


def endpoint_of(address: str) -> Endpoint:
    try:
        return Endpoint.parse(address)
    except ValueError as err:
        raise ConfigError(str(err)) from None


class Session:
    """One episode's WebSocket session: `request` sends a message and returns the server's answer."""

    def __init__(self, connection: Any, url: str):
        self.connection, self.url = connection, url

    @classmethod
    async def open(cls, url: str, timeout_s: float) -> Session:
        try:
            from websockets.asyncio.client import connect
        except ImportError:
            raise ConfigError("env.kind=openenv needs the websockets package: "
                              "pip install 'rlfleet[envs]'") from None
        try:
            connection = await asyncio.wait_for(
                connect(url, open_timeout=None, max_size=MAX_MESSAGE_BYTES, compression=None), timeout_s)
        except asyncio.TimeoutError:
            raise TimedOut(f"{url}: no session within {timeout_s:g}s") from None
        except OSError as err:
            raise Unreachable(f"{url}: {err}") from None
        except Exception as err:  # noqa: BLE001 - the handshake's own errors (HTTP status, bad upgrade)
            raise Unreachable(f"{url}: {type(err).__name__}: {err}") from None
        return cls(connection, url)

    async def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The answer to `message`; a {type: error} answer raises ServerError."""
        from websockets.exceptions import ConnectionClosed

        try:
            try:
                await asyncio.wait_for(self.connection.send(json.dumps(message)), timeout_s)
            except ConnectionClosed:
                pass  # the server may have said why before it closed (at capacity): read it below
            raw = await asyncio.wait_for(self.connection.recv(), timeout_s)
        except asyncio.TimeoutError:
            raise TimedOut(f"{self.url}: no answer to {message.get('type')} within {timeout_s:g}s") from None
        except (ConnectionClosed, OSError) as err:
            raise Unreachable(f"{self.url}: the session's connection closed ({err})") from None
        try:
            answer = json.loads(raw)
        except (ValueError, TypeError):
            raise BadReply(f"an answer that is not JSON: {str(raw)[:120]!r}") from None
        if not isinstance(answer, dict):
            raise BadReply(f"an answer that is a JSON {type(answer).__name__}, not an object")
        if answer.get("type") == "error":
            data = answer.get("data") if isinstance(answer.get("data"), dict) else {}
            message = str(data.get("message") or answer)
            if isinstance(data.get("errors"), list):  # pydantic's, for an invalid action
                message += ": " + "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}"
                                            for e in data["errors"] if isinstance(e, dict))
            raise ServerError(str(data.get("code") or "ERROR"), message[:500])
        return answer

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.connection.send(json.dumps({"type": "close"})), 2.0)
        except Exception:  # noqa: BLE001 - closing a session that is already gone
            pass
        try:  # the server closes the connection once it has read "close": wait for that first
            await asyncio.wait_for(self.connection.wait_closed(), 2.0)
        except Exception:  # noqa: BLE001
            pass
        try:
            await asyncio.wait_for(self.connection.close(), 2.0)
        except Exception:  # noqa: BLE001
            pass


async def _list_mcp_tools(endpoint: Endpoint, timeout_s: float) -> Any:
    session = await Session.open(endpoint.ws, timeout_s)
    try:
        reply = await session.request({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list",
                                                               "params": {}, "id": 1}}, timeout_s)
        return reply.get("data")
    finally:
        await session.close()


def fetch_action_spec(endpoint: Endpoint, timeout_s: float) -> ActionSpec:
    """The action mapping of the server's /schema (and its MCP tools, for an MCP action)."""
    schemas = get_json(endpoint.http + "/schema", timeout_s)
    if not isinstance(schemas, dict) or not isinstance(schemas.get("action"), dict):
        raise BadReply(f"GET {endpoint.http}/schema: no action schema in {str(schemas)[:200]}")
    schema = schemas["action"]
    tools = mcp_tools_of(asyncio.run(_list_mcp_tools(endpoint, timeout_s))) if is_mcp(schema) else ()
    return action_spec(schema, tools)
