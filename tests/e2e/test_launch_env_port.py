"""`rlfleet run` starts the built-in environment server on a port the server binds itself, and a restart
binds that same port. The launcher used to take a free port with bind(0), close it and hand the number to
the server, which bound it a second or more later, once imported: a window in which any other process on
the machine (an outgoing connection, another bind(0)) could take it, and the run failed to start (the
test that showed it, with that pick's port already in use: ff5805b)."""
from __future__ import annotations

import pytest

from rlfleet.app.launch import Launcher
from rlfleet.config import load_config

pytestmark = pytest.mark.e2e  # one real `rlfleet env serve` process


def test_the_environment_server_binds_its_own_port_and_keeps_it_for_a_restart(tmp_path):
    cfg = load_config(None, [f"run.output_dir={tmp_path}", "run.name=envport", "env.name=calculator"])
    launcher = Launcher(cfg)
    (launcher.run_dir / "services").mkdir(parents=True)
    (launcher.run_dir / "logs").mkdir(parents=True)
    config_path = launcher.run_dir / "config.yaml"
    config_path.write_text(cfg.to_yaml())
    try:
        address = launcher._start_environment(config_path)
        [child] = launcher.children
        started = child.proc.args
        assert started[started.index("--port") + 1] == "0"  # the server picked its port when it bound it
        port = address.rpartition(":")[2]
        assert int(port) > 0
        # the supervisor restarts the server with this command: the same port, where the rollout looks
        assert child.cmd[child.cmd.index("--port") + 1] == port
    finally:
        launcher.shutdown()
