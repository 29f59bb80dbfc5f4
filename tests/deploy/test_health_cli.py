"""`rlfleet health ADDRESS`: exit 0 only when the service answers SERVING.

The server is rlfleet's own (rlfleet.rpc.server.ServiceServer, as every service runs it), in
this process, on a free loopback port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from rlfleet.app.cli import main
from rlfleet.rpc.server import ServiceServer
from tests.e2e.conftest import REPO

pytestmark = pytest.mark.service


def _verdict(capsys) -> list[str]:
    """`ADDRESS STATUS`, the line `rlfleet health` printed (the in-process server logs to stdout too)."""
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("127.0.0.1:")]
    assert len(lines) == 1, lines
    return lines[0].split()


@pytest.fixture
def server():
    srv = ServiceServer(["rlfleet.v1.Reward"], "127.0.0.1", 0)
    srv.start()
    yield srv
    srv.stop(grace_s=0)


def test_not_serving_until_marked_then_serving(server, capsys):
    assert main(["health", server.address]) == 1
    assert _verdict(capsys) == [server.address, "NOT_SERVING"]
    server.mark_serving()
    assert main(["health", server.address]) == 0
    assert _verdict(capsys) == [server.address, "SERVING"]


def test_stopping_service_is_not_healthy(server, capsys):
    server.mark_serving()
    server.stop(grace_s=0)
    assert main(["health", "--timeout", "1", server.address]) == 1
    assert _verdict(capsys)[1] in ("NOT_SERVING", "UNREACHABLE")


def test_nothing_listening_is_unreachable(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: nothing answers
        t0 = time.monotonic()
        assert main(["health", "--timeout", "1", f"127.0.0.1:{port}"]) == 1
    assert time.monotonic() - t0 < 10
    assert _verdict(capsys)[1] == "UNREACHABLE"


def test_named_service(server, capsys):
    server.mark_serving()
    assert main(["health", "--quiet", "--service", "rlfleet.v1.Reward", server.address]) == 0
    assert main(["health", "--service", "rlfleet.v1.Nope", server.address]) == 1
    assert _verdict(capsys) == [server.address, "SERVICE_UNKNOWN"]


def test_wait_returns_once_the_model_is_loaded(server):
    timer = threading.Timer(1.5, server.mark_serving)
    t0 = time.monotonic()  # before the timer starts: SERVING comes 1.5 s after t0 at the earliest
    timer.start()
    try:
        assert main(["health", "--quiet", "--wait", "60", server.address]) == 0
        assert 1.5 <= time.monotonic() - t0 < 20  # once it serves, not after the whole 60 s
    finally:
        timer.cancel()


def test_wait_gives_up_after_its_deadline(server):
    t0 = time.monotonic()
    assert main(["health", "--quiet", "--wait", "1.5", server.address]) == 1
    assert 1.4 < time.monotonic() - t0 < 10


def test_wait_ends_when_the_service_process_is_gone(server):
    """systemd's ExecStartPost passes --pid $MAINPID: a service that died while loading (exit 78,
    RestartPreventExitStatus) must fail its unit now, not after the whole --wait."""
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    try:
        t0 = time.monotonic()
        assert main(["health", "--quiet", "--wait", "60", "--pid", str(gone.pid), server.address]) == 1
        assert time.monotonic() - t0 < 20
    finally:
        gone.kill()
        gone.wait()
    # A live process does not cut the wait short.
    timer = threading.Timer(1.0, server.mark_serving)
    timer.start()
    try:
        assert main(["health", "--quiet", "--wait", "30", "--pid", str(os.getpid()), server.address]) == 0
    finally:
        timer.cancel()


def test_the_command_exit_status(server):
    """As container health checks, ExecStartPost and the Slurm script run it: a separate process."""

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rlfleet.app.cli", "health", server.address],
            cwd=REPO,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run().returncode == 1
    server.mark_serving()
    done = run()
    assert done.returncode == 0 and done.stdout.split() == [server.address, "SERVING"], done.stderr
