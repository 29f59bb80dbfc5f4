"""The environment client for env.kind: the agent loop talks to either through start/step/end/close.

    grpc     services/rollout/env_client.py: an rlfleet.v1.Environment server (batched calls)
    openenv  services/rollout/openenv_client.py: an OpenEnv server (a WebSocket session per episode)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlfleet.config import EnvConfig
from rlfleet.rpc.security import Security


def _grpc(env: EnvConfig, security: Security | None) -> Any:
    from services.rollout.env_client import EnvClient

    return EnvClient(env.address, env.timeout_s, env.batch_size, env.max_concurrency, security)


def _openenv(env: EnvConfig, security: Security | None) -> Any:
    from services.rollout.openenv_client import OpenEnvClient

    return OpenEnvClient(env.address, env.timeout_s, env.max_concurrency, env.reward_mode)


ENV_CLIENTS: dict[str, Callable[[EnvConfig, Security | None], Any]] = {"grpc": _grpc, "openenv": _openenv}


def build_env_client(env: EnvConfig, security: Security | None = None) -> Any:
    """A client of the environment at env.address, by env.kind."""
    return ENV_CLIENTS[env.kind](env, security)
