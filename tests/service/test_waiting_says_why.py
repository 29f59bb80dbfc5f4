"""While one part waits for a service, it says every few seconds which role, where, and the last
error; the final error names the same (issue 22: `rlfleet controller` pointed at an address where
nothing listened printed nothing for 120 s)."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlfleet.errors import ServiceUnavailable
from rlfleet.rpc.channel import wait_until_serving
from rlfleet.rpc.security import Security
from rlfleet.rpc.server import ServiceServer
from tests.tls_certs import make_pki

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]


def _closed_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_waiting_for_nothing_listening_says_connection_refused(capsys):
    address = _closed_address()
    with pytest.raises(ServiceUnavailable) as err:
        wait_until_serving(address, "learner", timeout_s=4, report_every_s=1)
    said = capsys.readouterr().err
    assert f"rlfleet: waiting for the learner service at {address}: connection refused" in said, said
    assert f"learner service at {address}" in str(err.value) and "connection refused" in str(err.value)


def test_waiting_for_a_service_still_loading_says_not_yet_serving(capsys):
    server = ServiceServer(["x"], "127.0.0.1", 0, max_workers=2, security=Security())
    server.start()  # health NOT_SERVING until mark_serving()
    try:
        threading.Timer(4.0, server.mark_serving).start()
        wait_until_serving(server.address, "rollout", timeout_s=30, report_every_s=1)
        said = capsys.readouterr().err
        assert f"waiting for the rollout service at {server.address}: not yet serving" in said, said
    finally:
        server.stop(grace_s=0)


def test_waiting_with_tls_for_a_plaintext_service_says_tls_failure(tmp_path):
    pki = make_pki(tmp_path / "pki")
    server = ServiceServer(["x"], "127.0.0.1", 0, max_workers=2, security=Security())
    server.start()
    server.mark_serving()
    client = Security(cert=pki.client_cert.read_bytes(), key=pki.client_key.read_bytes(),
                      ca=pki.ca.read_bytes())
    try:
        with pytest.raises(ServiceUnavailable, match="reward service at .*: TLS failure"):
            wait_until_serving(server.address, "reward", timeout_s=3, security=client)
    finally:
        server.stop(grace_s=0)


def test_rlfleet_controller_says_what_it_waits_for_within_seconds(tmp_path):
    address = _closed_address()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.app.cli", "controller", f"run.output_dir={tmp_path}",
         f"rollout.address={address}", f"reward.address={address}", f"learner.address={address}",
         "controller.connect_timeout_s=60"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), ln)) for ln in proc.stdout],
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        waiting = []
        while not waiting and time.monotonic() < deadline and proc.poll() is None:
            waiting = [(t, ln) for t, ln in lines if "waiting for the rollout service" in ln]
            time.sleep(0.2)
        started = [t for t, ln in lines if "training prompts" in ln]  # just before it connects
        assert waiting and started, "".join(ln for _, ln in lines)
        t, line = waiting[0]
        # its first line ~3 s in, not after the 60 s connect timeout in silence
        assert t - started[0] < 20, (t - started[0], line)
        assert address in line and "connection refused" in line, line
    finally:
        proc.kill()  # our own child, by its handle
        proc.wait(30)
