"""Real OpenEnv servers for the tests, built with openenv-core's own server helpers (create_app):

    digits     a text environment (action `message: str`): the digits game of environments/digits_game.py,
               written the OpenEnv way (docs/environments.md shows both side by side)
    guess      a typed-action environment (action GuessNumber {guess: int, reason: str | None}): guess the
               ground truth; each wrong guess is answered "higher" or "lower"
    calculator an MCP environment (tools add and multiply), ended by the answer tool `submit`

`python -m tests.openenv_servers NAME [--port P] [--max-sessions S]` serves one and prints "serving on http://HOST:PORT";
`serving(NAME)` runs one in a thread of the test (a context manager yielding its address).
"""
from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from pydantic import Field

MAX_SESSIONS = 512


# ---- digits: a text environment -----------------------------------------------------------------
class Attempt(Action):
    message: str = Field(description="the model's reply")


class Feedback(Observation):
    feedback: str = ""


def digit_credit(attempt: str, answer: str) -> float:
    digits = "".join(ch for ch in attempt if ch.isdigit())
    width = max(len(digits), len(answer))
    return sum(a == b for a, b in zip(digits, answer)) / width if width else 0.0


class DigitsGameEnv(Environment):
    """Reverse a digit string in up to `max_tries` attempts; the reward (given at the end) is the last
    attempt's per-digit credit less 0.25 per extra try, as the gRPC digits_game's."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_tries: int = 2):
        super().__init__()
        self.max_tries = max_tries
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.answer = ""

    def reset(self, seed: int | None = None, episode_id: str | None = None, ground_truth: str = "",
              **kwargs: Any) -> Feedback:
        if not ground_truth.isdigit():
            raise ValueError(f"ground_truth {ground_truth!r} is not a digit string")
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.answer = ground_truth
        return Feedback()

    def step(self, action: Attempt, timeout_s: float | None = None, **kwargs: Any) -> Feedback:
        self._state.step_count += 1
        attempt = action.message.strip()
        if attempt == self.answer or self._state.step_count >= self.max_tries:
            reward = digit_credit(attempt, self.answer) - 0.25 * (self._state.step_count - 1)
            return Feedback(done=True, reward=reward)
        return Feedback(feedback="Reverse the digits: " + self.answer[::-1], reward=0.0)

    @property
    def state(self) -> State:
        return self._state


# ---- guess: a typed-action environment ----------------------------------------------------------
class GuessNumber(Action):
    """Guess the secret number."""

    guess: int = Field(description="the number guessed")
    reason: str | None = Field(None, description="why (optional)")


class Hint(Observation):
    hint: str = ""
    guesses: int = 0


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, ground_truth: str = "0",
              **kwargs: Any) -> Hint:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = int(ground_truth)
        return Hint(hint="Guess the number.")

    def step(self, action: GuessNumber, timeout_s: float | None = None, **kwargs: Any) -> Hint:
        self._state.step_count += 1
        if action.guess == self.secret:
            return Hint(hint="right", guesses=self._state.step_count, done=True, reward=1.0)
        return Hint(hint="higher" if action.guess < self.secret else "lower", guesses=self._state.step_count,
                    reward=-0.1)

    @property
    def state(self) -> State:
        return self._state


# ---- calculator: an MCP environment -------------------------------------------------------------
class CalculatorEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("calculator")
        self.submitted: list[float] = []

        @mcp.tool
        def add(a: float, b: float) -> float:
            """Add two numbers."""
            return a + b

        @mcp.tool
        def multiply(a: float, b: float) -> float:
            """Multiply two numbers."""
            return a * b

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return Observation()

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        observation = super().step(action, timeout_s=timeout_s, **kwargs)
        return observation.model_copy(update={"reward": 0.5, "done": self._state.step_count >= 2})

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        return observation.model_copy(update={"reward": 0.5, "done": self._state.step_count >= 2})

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state


APPS = {
    "digits": lambda sessions: create_fastapi_app(DigitsGameEnv, Attempt, Feedback,
                                                  max_concurrent_envs=sessions),
    "guess": lambda sessions: create_fastapi_app(GuessEnv, GuessNumber, Hint, max_concurrent_envs=sessions),
    "calculator": lambda sessions: create_fastapi_app(CalculatorEnv, CallToolAction, CallToolObservation,
                                                      max_concurrent_envs=sessions),
}


def _server(name: str, sock: socket.socket, sessions: int | None = None):
    import uvicorn

    app = APPS[name](sessions if sessions is not None else MAX_SESSIONS)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    return uvicorn.Server(config)


def _socket(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


@contextlib.contextmanager
def serving(name: str) -> Iterator[str]:
    """The OpenEnv server `name` in a thread of this process, until the block ends; yields its address."""
    sock = _socket()
    server = _server(name, sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the OpenEnv test server {name} did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(APPS))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-sessions", type=int, default=None,
                        help="the server's max_concurrent_envs (sessions open at once)")
    args = parser.parse_args(argv)
    sock = _socket(args.port)
    server = _server(args.name, sock, args.max_sessions)
    print(f"serving on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
