"""Environment servers behind the job's `security`: the rollout's agent loop (build_agent) reaches one
with the job's mutual TLS and bearer token, and a client that lacks a piece is refused before the
environment hears of it; `rlfleet env serve --config` serves with the config's TLS and token, and
`rlfleet env check --config` checks such a server."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import yaml

from rlfleet.app.env_check import FAIL, check_server
from rlfleet.app.env_sdk import Environment, Step, serve
from rlfleet.config import EnvConfig, RolloutConfig
from rlfleet.env.types import Action, EpisodeRow
from rlfleet.models.tiny import ensure_tiny_model
from rlfleet.rpc.channel import health_status, open_channel
from rlfleet.rpc.security import Security
from rlfleet.types import DataRow, PromptRequest, SamplingParams
from services.rollout.agent_loop import build_agent
from services.rollout.engines.hf import HFEngine
from services.rollout.env_client import EnvClient
from tests.e2e.test_external_reward import start_server, stop_server
from tests.service.test_security import TOKEN, client_security, server_security
from tests.tls_certs import Pki, make_pki

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class Counting(Environment):
    """Rewards any first turn; counts the episodes it was asked to start."""

    name = "counting"

    def __init__(self):
        self.started = 0

    def start(self, row):
        self.started += 1
        return {}

    def step(self, state, action):
        return Step(reward=1.0, done=True)


def test_the_agent_loop_uses_the_job_security_and_a_client_without_the_token_is_refused(pki: Pki):
    env = Counting()
    with serve(env, block=False, security=server_security(pki)) as server:
        # the rollout's agent loop, built as `rlfleet serve rollout` and `rlfleet eval` build it
        engine = HFEngine(ensure_tiny_model(), torch.device("cpu"), torch.float32)
        agent = build_agent(engine, RolloutConfig(max_turns=2), EnvConfig(address=server.address),
                            client_security(pki))
        ids = engine.tokenizer("Reverse the digits: 4721", add_special_tokens=False)["input_ids"]
        row = DataRow("digits_reverse", "Reverse the digits: 4721", "1274")
        [group] = agent.generate([PromptRequest("p0", ids, row)], SamplingParams(n=2, max_new_tokens=4))
        agent.env.close()
        assert [(c.failed, c.env_reward, len(c.turns)) for c in group.completions] == [(False, 1.0, 1)] * 2
        assert env.started == 2

        refused = {
            "no token": client_security(pki, token=None),
            "a wrong token": client_security(pki, token="wrong-token-0123456789"),
        }
        for what, security in refused.items():
            client = EnvClient(server.address, timeout_s=5.0, security=security)
            [result], _ = client.start([EpisodeRow("e1")])
            client.close()
            assert (result.ok, result.failure) == (False, "rpc_error"), what
            assert "UNAUTHENTICATED" in result.error and "episode e1" in result.error, what
        plain = EnvClient(server.address, timeout_s=5.0)  # no TLS at all: the handshake fails
        [result], _ = plain.start([EpisodeRow("e2")])
        plain.close()
        assert (result.ok, result.failure) == (False, "unavailable")
        assert env.started == 2  # none of them reached the environment
        # health needs no token (the controller's outage probe, container health checks), only TLS
        with open_channel(server.address, client_security(pki, token=None)) as channel:
            assert health_status(channel) == "SERVING"
        # the conformance check with the job's security passes; without the token every check fails
        checks = check_server(server.address, security=client_security(pki))
        assert [c for c in checks if c.result == FAIL] == []
        without = check_server(server.address, security=client_security(pki, token=None))
        assert any(c.result == FAIL for c in without)


def test_env_serve_takes_tls_and_token_from_the_config(pki: Pki, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = tmp_path / "job.yaml"
    job = {"env": {"name": "digits_game", "params": {"max_tries": 3}},
           "security": {"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key),
                        "tls_ca": str(pki.ca)}}
    config.write_text(yaml.safe_dump(job))
    # the environment's name from env.name; the token file as a dotted override in its place
    proc, address = start_server([sys.executable, "-m", "rlfleet.app.cli", "env", "serve",
                                  f"security.token_file={token_file}", "--config", str(config)],
                                 tmp_path, "serving on ")
    try:
        tls_only = Security(ca=pki.ca.read_bytes())
        with_token = Security(ca=pki.ca.read_bytes(), token=TOKEN)
        client = EnvClient(address, timeout_s=5.0, security=tls_only)
        [refused], _ = client.start([EpisodeRow("e1", ground_truth="1274")])
        client.close()
        assert (refused.ok, refused.failure) == (False, "rpc_error") and "UNAUTHENTICATED" in refused.error
        client = EnvClient(address, timeout_s=5.0, security=with_token)
        [started], _ = client.start([EpisodeRow("e2", ground_truth="1274")])
        assert started.ok and not started.done
        # env.params of the config reached the game: a second wrong try is not its last (max_tries=3)
        for turn in (1, 2):
            [wrong], _ = client.step([Action("e2", "0000", turn=turn)])
            assert wrong.ok and not wrong.done, turn
        client.close()

        def check() -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "rlfleet.app.cli", "env", "check", address,
                                   "--config", str(config), "--action=1274"],
                                  capture_output=True, text=True, timeout=60)

        assert check().returncode == 1  # the config gives TLS but no token: refused
        job["security"]["token_file"] = str(token_file)
        config.write_text(yaml.safe_dump(job))
        passed = check()
        assert passed.returncode == 0, passed.stdout[-2000:]
    finally:
        stop_server(proc)
