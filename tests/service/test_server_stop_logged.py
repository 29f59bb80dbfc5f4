"""A service stopped by SIGTERM logs "stopped" before its process ends.

The signal handler stops the server in a daemon thread while the main thread sits in `wait()`. gRPC
ends `wait_for_termination` as soon as the server is down, so without a hand-off the main thread
returned, the interpreter exited and killed the daemon thread before it wrote "stopped" (the Slurm
test found a rollout log ending at "signal received" on a loaded CI machine).
"""
from __future__ import annotations

import threading
import time

import pytest

from rlfleet.rpc import server as server_module
from rlfleet.rpc.server import ServiceServer

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


class SlowStoppedLog:
    """Records events; "stopped" is recorded only after a pause, widening the race to a certainty."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def info(self, event: str, **_fields: object) -> None:
        if event == "stopped":
            time.sleep(0.5)
        self.events.append(event)


def test_wait_returns_only_after_stopped_is_logged(monkeypatch):
    log = SlowStoppedLog()
    monkeypatch.setattr(server_module, "log", log)
    server = ServiceServer(["rlfleet.test.Nothing"], "127.0.0.1", 0)
    server.start()
    # what the SIGTERM handler does: stop in a daemon thread
    threading.Thread(target=server.stop, args=(0.0,), daemon=True).start()
    server.wait()
    assert log.events[-1] == "stopped", log.events
