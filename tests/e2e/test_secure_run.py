"""`rlfleet run` with TLS, mutual TLS and a bearer token on every channel, end to end.

Every service, the controller's status server and every client channel use the certificates
from tests/tls_certs.py; the weight group admits the rollout with the same token. While the
run goes on, a client without the token and a plain-text client are refused by the rollout
service, and `rlfleet health --config` reaches it over TLS.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from rlfleet.proto.v1 import common_pb2, rollout_pb2_grpc
from rlfleet.rpc.security import Security, secure_channel
from tests.e2e.conftest import REPO, read_jsonl, rlfleet
from tests.tls_certs import make_pki, secure_job_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

TOKEN = "e2e-token-0123456789abcdef"


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file():
            return json.loads(path.read_text())
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else "run exited"
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


def _code(channel: grpc.Channel) -> grpc.StatusCode:
    try:
        rollout_pb2_grpc.RolloutStub(channel).GetStatus(common_pb2.GetStatusRequest(), timeout=10)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_run_with_mutual_tls_and_token(run_dir, tmp_path):
    pki = make_pki(tmp_path / "pki")
    config = secure_job_config(tmp_path, pki, TOKEN)
    steps = 3
    cmd = [sys.executable, "-m", "rlfleet.app.cli", "run", "--config", str(config),
           f"run.output_dir={run_dir}",
           "run.name=secure", f"controller.max_steps={steps}", "controller.prompts_per_step=4",
           "controller.prompts_per_request=4", "rollout.n=4", "learner.verify_weights=true"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        rollout = _wait_for(run_dir / "secure" / "services" / "rollout.json", proc)
        address = rollout["address"]
        trusted = {"cert": pki.client_cert.read_bytes(), "key": pki.client_key.read_bytes(),
                   "ca": pki.ca.read_bytes()}
        with secure_channel(address, Security(**trusted)) as no_token:
            assert _code(no_token) == grpc.StatusCode.UNAUTHENTICATED
        with secure_channel(address, Security(**trusted, token="wrong-token-0123456789")) as wrong_token:
            assert _code(wrong_token) == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(address) as plain:
            assert _code(plain) == grpc.StatusCode.UNAVAILABLE
        # `rlfleet status` takes TLS and token from the run folder's config.yaml.
        status = rlfleet("status", str(run_dir / "secure"), "--json", timeout=90)
        rows = {r["role"]: r for r in json.loads(status.stdout)}
        assert rows["rollout"]["health"] in {"SERVING", "NOT_SERVING"}, status.stdout
        assert rows["rollout"]["version"] != "-" and not rows["rollout"]["last_error"], status.stdout
        health = rlfleet("health", address, "--config", str(config), "--wait", "60", timeout=90)
        assert health.returncode == 0 and "SERVING" in health.stdout, health.stdout + health.stderr
        with secure_channel(address, Security(**trusted, token=TOKEN)) as good:
            assert _code(good) == grpc.StatusCode.OK
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # SIGTERM: the launcher stops its services
            proc.terminate()
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    out = run_dir / "secure"
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    # Versions advanced: the weight group (with the token) carried every update to the rollout,
    # and learner.verify_weights compared the weights after each sync.
    assert [m["policy_version"] for m in lines] == list(range(steps))
    assert TOKEN not in (out / "config.yaml").read_text()  # the run folder names the token file only


def test_run_with_an_environment_behind_tls_and_token(run_dir, tmp_path):
    """`rlfleet run` serves env.name with the job's TLS and token, and its rollout plays the episodes
    through them; a client without the token is refused by the environment server."""
    from rlfleet.env.types import EpisodeRow
    from services.rollout.env_client import EnvClient

    pki = make_pki(tmp_path / "pki")
    config = secure_job_config(tmp_path, pki, TOKEN)
    cmd = [sys.executable, "-m", "rlfleet.app.cli", "run", "--config", str(config),
           f"run.output_dir={run_dir}", "run.name=secure-env", "controller.max_steps=2",
           "controller.prompts_per_step=4", "controller.prompts_per_request=4", "rollout.n=4",
           "env.name=digits_game", "rollout.max_turns=2"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        address = _wait_for(run_dir / "secure-env" / "services" / "env.json", proc)["address"]
        trusted = {"cert": pki.client_cert.read_bytes(), "key": pki.client_key.read_bytes(),
                   "ca": pki.ca.read_bytes()}
        client = EnvClient(address, timeout_s=10.0, security=Security(**trusted))
        [refused], _ = client.start([EpisodeRow("intruder", ground_truth="1274")])
        client.close()
        assert (refused.ok, refused.failure) == (False, "rpc_error") and "UNAUTHENTICATED" in refused.error
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    lines = read_jsonl(run_dir / "secure-env" / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:  # every episode reached the environment through TLS and the token
        assert m["env/episodes"] == 16 and m["env/failed"] == 0 and m["env/with_env_reward"] == 16
    assert "refused a call" in (run_dir / "secure-env" / "logs" / "env.stderr").read_text()
