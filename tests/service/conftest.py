"""Fixtures for the servicer tests: one in-process server per role over the tiny model's cores."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from rlfleet.config import LearnerConfig
from services.reward.scorer import RewardScorer
from services.rollout.engines.hf import HFEngine
from tests.service.servicer_harness import (
    CPU,
    Running,
    attach,
    make_learner,
    start,
    stop,
)


@pytest.fixture
def started() -> Iterator[Callable[[str], Running]]:
    servers: list[Running] = []

    def _start(role: str) -> Running:
        servers.append(start(role))
        return servers[-1]

    yield _start
    for running in servers:
        stop(running)


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir: Path) -> HFEngine:
    return HFEngine(tiny_model_dir, CPU, torch.float32, max_batch_sequences=4)


@pytest.fixture(scope="module")
def learner_cfg() -> LearnerConfig:
    return LearnerConfig(lr=1e-3, micro_batch_tokens=16)


@pytest.fixture(scope="module")
def reward_server() -> Iterator[Running]:
    running = start("reward")
    attach("reward", running, RewardScorer("tests.reward_fixtures:score"))
    yield running
    stop(running)


@pytest.fixture(scope="module")
def auto_reward_server() -> Iterator[Running]:
    running = start("reward")
    attach("reward", running, RewardScorer("auto"))
    yield running
    stop(running)


@pytest.fixture(scope="module")
def rollout_server(hf_engine: HFEngine) -> Iterator[Running]:
    running = start("rollout")
    attach("rollout", running, hf_engine)
    yield running
    stop(running)


@pytest.fixture
def learner_server(tiny_model_dir: Path, learner_cfg: LearnerConfig, tmp_path: Path) -> Iterator[Running]:
    """A fresh learner (policy version 0) per test."""
    running = start("learner")
    attach("learner", running, make_learner(tiny_model_dir, learner_cfg, tmp_path / "checkpoints"))
    yield running
    stop(running)


# ---- (a) health and readiness -------------------------------------------------------------------
