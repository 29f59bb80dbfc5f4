"""Serve an environment: a few lines of Python become an rlfleet environment server.

    from rlfleet.app.env_sdk import Environment, Message, Step, serve

    class Guess(Environment):
        name = "guess"

        def start(self, row):
            return {"answer": row.ground_truth, "tries": 0}

        def step(self, state, action):
            state["tries"] += 1
            if action.text.strip() == state["answer"]:
                return Step(reward=1.0, done=True)
            return Step(observation=[Message("user", "No. Try again.")], done=state["tries"] >= 3,
                        reward=0.0 if state["tries"] >= 3 else None)

    serve(Guess(), port=50061)            # blocks until SIGTERM / Ctrl-C

The server implements `rlfleet.v1.Environment` (docs/environments.md) with the contract's rules
built in: one result per episode in order, episode states kept by id, an exception in `start` or
`step` failing that episode alone (ok=false, naming it), ids checked, the caller's deadline kept.
It also serves `grpc.health.v1` (SERVING once started) and server reflection.

From a shell: `rlfleet env serve NAME|pkg.module:Class --port 50061` (built-ins: calculator,
python, digits_game); `--config job.yaml` serves it with the job's `security` (TLS, bearer token)
and `limits`, as the job's other services, and takes env.name, env.port and env.params from it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from rlfleet.env.base import Environment, Step
from rlfleet.env.types import Action, EpisodeRow, Message, Observation, ToolCall, ToolSpec

__all__ = ["Action", "EnvServer", "Environment", "EpisodeRow", "Message", "Observation", "Step", "ToolCall",
           "ToolSpec", "serve"]


class EnvServer:
    """A running environment server; `address` is host:port as bound (port 0 picks a free one)."""

    def __init__(self, env: Environment | str, host: str, port: int, params: dict[str, Any] | None,
                 max_workers: int, security=None, handle_signals: bool = False, idle_expiry_s: float = 600.0):
        """`handle_signals`: SIGTERM and SIGINT stop it gracefully, from before it says SERVING (a
        supervisor that stops it as soon as it is healthy must not kill it instead); main thread only."""
        from environments.registry import load_environment
        from environments.servicer import SERVICE_NAME, EnvironmentServicer
        from rlfleet.proto.v1 import environment_pb2_grpc
        from rlfleet.rpc.server import ServiceServer

        env = load_environment(env, params) if isinstance(env, str) else env
        self.servicer = EnvironmentServicer(env, workers=max_workers, idle_expiry_s=idle_expiry_s)
        self._server = ServiceServer([SERVICE_NAME], host, port, max_workers=max_workers, security=security,
                                     on_refused=_log_refused)
        self._server.add(environment_pb2_grpc.add_EnvironmentServicer_to_server, self.servicer)
        if handle_signals:
            self._server.install_signal_handlers()
        self._server.start()
        self._server.mark_serving()

    @property
    def address(self) -> str:
        return self._server.address

    def stop(self, grace_s: float = 5.0) -> None:
        self._server.stop(grace_s)
        self.servicer.close()

    def wait(self) -> None:
        self._server.wait()

    def __enter__(self) -> EnvServer:  # noqa: PYI034 - the class is not meant to be subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace_s=1.0)


def _log_refused(method: str, reason: str) -> None:
    import structlog

    structlog.get_logger(__name__).warning("refused a call: it must carry the job's security.token",
                                           method=method, reason=reason)


def serve(env: Environment | str, port: int = 0, host: str = "127.0.0.1", *,
          params: dict[str, Any] | None = None, max_workers: int = 8, block: bool = True,
          announce: Path | None = None, security=None, idle_expiry_s: float = 600.0) -> EnvServer:
    """Serves `env` (an Environment, a built-in name or 'pkg.module:Class').

    `block=True` (the default) serves until SIGTERM or Ctrl-C; `block=False` returns the running server
    at once (`server.address`, `server.stop()`). `announce`: a file the address is written to (JSON).
    `security`: TLS and bearer token (`rlfleet.rpc.security.Security.from_config(cfg.security)`);
    None: plain gRPC. `idle_expiry_s`: an episode no call named for this long is dropped, its `end(state,
    "expired")` called (End may never come from a rollout that crashed)."""
    server = EnvServer(env, host, port, params, max_workers, security, handle_signals=block,
                       idle_expiry_s=idle_expiry_s)
    if announce is not None:
        tmp = announce.with_suffix(".tmp")
        tmp.write_text(json.dumps({"address": server.address, "role": "env", "pid": os.getpid()}))
        tmp.replace(announce)
    if block:
        from rlfleet.rpc.service_main import PARENT_PID_ENV, stop_when_parent_exits

        if os.environ.get(PARENT_PID_ENV):  # started by `rlfleet run`: no orphan if it is killed
            stop_when_parent_exits(server._server, int(os.environ[PARENT_PID_ENV]))
        print(f"rlfleet environment server: serving on {server.address}", flush=True)
        server.wait()
        server.servicer.close()
    return server


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="rlfleet env serve")
    parser.add_argument("environment", nargs="?", default=None,
                        help="a built-in environment (calculator, python, digits_game) or pkg.module:Class; "
                        "default: env.name of the config")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=None, help="default: env.port of the config; 0 picks a "
                        "free port (printed on stdout)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument of the environment's constructor (value parsed as YAML); "
                        "repeatable; added to env.params of the config")
    parser.add_argument("--config", "-c", help="job YAML: its `security` (TLS, mutual TLS, bearer token) and "
                        "`limits` are served with, as by the job's other services; env.name, env.port and "
                        "env.params are the defaults of the options above")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides "
                        "(security.token_file=F …)")
    parser.add_argument("--announce", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def parse_params(raw: list[str]) -> dict[str, Any]:
    from rlfleet.errors import ConfigError

    params = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r} is not KEY=VALUE")
        params[key] = yaml.safe_load(value)
    return params


def serve_from_args(args: argparse.Namespace) -> None:
    from rlfleet.config import load_config
    from rlfleet.errors import ConfigError
    from rlfleet.logging import setup_logging
    from rlfleet.rpc.security import Security

    overrides = list(args.overrides)
    # `rlfleet env serve security.token_file=F` (the name from the config): a dotted override fills
    # the optional positional first; no environment's name or import path holds a "=".
    if args.environment is not None and "=" in args.environment:
        overrides.insert(0, args.environment)
        args.environment = None
    cfg = load_config(args.config, overrides)
    name = args.environment or cfg.env.name
    if not name:
        raise ConfigError("rlfleet env serve needs an environment: NAME (calculator, python, digits_game, "
                          "pkg.module:Class) or env.name in the config")
    security = Security.from_config(cfg.security, cfg.limits)  # bad TLS files are named before binding
    setup_logging("env", "info", None)
    serve(name, port=cfg.env.port if args.port is None else args.port, host=args.host,
          params={**cfg.env.params, **parse_params(args.param)}, announce=args.announce, security=security)


if __name__ == "__main__":
    serve_from_args(build_parser().parse_args(sys.argv[1:]))
