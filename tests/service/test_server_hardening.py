"""Holes an independent tester found in the server layer, each closed (issue 15).

- 20 unauthenticated health Watch streams must not starve authenticated calls or Health/Check;
- a second server on a taken port is refused with an error naming the port (no SO_REUSEPORT);
- a garbage TLS certificate, key or CA is named when the security config is loaded.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.errors import ConfigError
from rlfleet.proto.v1 import reward_pb2
from rlfleet.rpc.security import Security, secure_channel
from rlfleet.rpc.server import ServiceServer
from rlfleet.security_config import SecurityConfig
from services.reward.scorer import RewardScorer
from tests.service.servicer_harness import ROLES
from tests.tls_certs import make_pki

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]

TOKEN = "hardening-token-0123456789"


@pytest.fixture
def token_reward_server() -> Iterator[ServiceServer]:
    spec = ROLES["reward"]
    servicer = spec.servicer_cls()
    server = ServiceServer([spec.service_name], "127.0.0.1", 0, security=Security(token=TOKEN))
    server.add(spec.add_fn, servicer)
    server.start()
    servicer.attach(RewardScorer("tests.reward_fixtures:score"))
    server.mark_serving()
    yield server
    server.stop(grace_s=0)


def test_health_watch_streams_cannot_starve_authenticated_calls(token_reward_server):
    address = token_reward_server.address
    watchers = []
    refused = []
    with grpc.insecure_channel(address) as anonymous:  # no token: health is all it may call
        stub = health_pb2_grpc.HealthStub(anonymous)
        for _ in range(20):
            stream = stub.Watch(health_pb2.HealthCheckRequest(), timeout=60)
            watchers.append(stream)
        opened = 0
        for stream in watchers:  # the first answer of each: SERVING, or refused at once
            try:
                assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
                opened += 1
            except grpc.RpcError as err:
                refused.append(err.code())
        try:
            with secure_channel(address, Security(token=TOKEN)) as trusted:
                start = time.monotonic()
                item = reward_pb2.ScoreItem(id="a", data_source="custom", response="4", ground_truth="4")
                stub = ROLES["reward"].stub_cls(trusted)
                # Starved, they would wait for the watchers' 60 s; answered, they take milliseconds.
                reply = stub.Score(reward_pb2.ScoreRequest(items=[item]), timeout=20)
                assert reply.results[0].score == 1.0
                health = health_pb2_grpc.HealthStub(trusted)
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=20)
                assert status.status == health_pb2.HealthCheckResponse.SERVING
                assert time.monotonic() - start < 20
        finally:
            for stream in watchers:
                stream.cancel()
    assert opened == 4 and refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 16, (opened, refused)


def test_a_taken_port_is_refused_by_name():
    first = ServiceServer(["x"], "127.0.0.1", 0, max_workers=1, security=Security())
    first.start()
    try:
        with pytest.raises(ConfigError, match=rf"cannot bind 127\.0\.0\.1:{first.port}: the port is "
                           r"already in use"):
            ServiceServer(["x"], "127.0.0.1", first.port, max_workers=1, security=Security())
    finally:
        first.stop(grace_s=0)


def test_two_reward_servers_cannot_share_a_port_across_processes(tmp_path):
    """Two real processes, as `rlfleet serve reward reward.port=P` twice: the second exits naming the port."""
    import subprocess
    import sys

    script = ("import sys, time\n"
              "from rlfleet.rpc.server import ServiceServer\n"
              "from rlfleet.rpc.security import Security\n"
              "from rlfleet.errors import ConfigError\n"
              "try:\n"
              "    s = ServiceServer(['x'], '127.0.0.1', int(sys.argv[1]), max_workers=1, "
              "security=Security())\nexcept ConfigError as e:\n"
              "    print(e); sys.exit(2)\n"
              "s.start(); print('PORT', s.port, flush=True); time.sleep(60)\n")
    first = subprocess.Popen([sys.executable, "-c", script, "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = first.stdout.readline()
        while line and not line.startswith("PORT "):  # the server logs to stdout too
            line = first.stdout.readline()
        port = int(line.split()[1])
        second = subprocess.run([sys.executable, "-c", script, str(port)], check=False, capture_output=True,
                                text=True, timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"cannot bind 127.0.0.1:{port}: the port is already in use" in second.stdout
    finally:
        first.kill()
        first.wait()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize("bad", ["tls_cert", "tls_key", "tls_ca", "mismatched tls_key"])
def test_a_garbage_tls_file_is_named(pki, tmp_path: Path, bad: str):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    files = {"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key), "tls_ca": str(pki.ca)}
    key = bad.split()[-1]
    files[key] = str(pki.rogue_key) if bad.startswith("mismatched") else str(garbage)
    with pytest.raises(ConfigError, match=rf"security\.{key} {files[key]}: not a PEM"):
        Security.from_config(SecurityConfig(**files))
    Security.from_config(SecurityConfig(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key),
                                        tls_ca=str(pki.ca)))  # the good files still load


def test_health_watch_limit_frees_its_slot_when_a_stream_ends(token_reward_server):
    with grpc.insecure_channel(token_reward_server.address) as anonymous:
        stub = health_pb2_grpc.HealthStub(anonymous)
        for _ in range(6):  # more than the limit, one after the other
            stream = stub.Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
            stream.cancel()
            time.sleep(0.2)  # the server notices the cancel and releases the slot


