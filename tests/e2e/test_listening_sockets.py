"""Every socket a default `rlfleet run` listens on is on 127.0.0.1 (issue 15).

The controller, every service process and the learner's weight-group store are sampled
while a short run goes on (psutil reads /proc/net/tcp{,6} and each process's descriptors).
The store used to listen on every interface (`*:PORT`) while it was announced as 127.0.0.1.
"""
from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time

import psutil
import pytest

from tests.e2e.conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]


def _ipv4(ip: str) -> str:
    """gRPC binds 127.0.0.1 on a dual-stack socket (::ffff:127.0.0.1): the same loopback-only address."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def _listening(root: psutil.Process) -> set[tuple[int, str, str, int]]:
    """(pid, process name, ip, port) of every listening TCP socket of `root` and its descendants."""
    seen = set()
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return seen
    for proc in processes:
        try:
            name = " ".join(proc.cmdline()[1:4])
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    seen.add((proc.pid, name, _ipv4(conn.laddr.ip), conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return seen


def test_every_process_of_a_run_listens_on_loopback_only(run_dir, tmp_path):
    log = tmp_path / "run.log"
    cmd = [sys.executable, "-m", "rlfleet.app.cli", "run", f"run.output_dir={run_dir}", "run.name=sockets",
           "controller.max_steps=3", "controller.prompts_per_step=4", "controller.prompts_per_request=4",
           "rollout.n=2"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        root = psutil.Process(proc.pid)
        seen: set[tuple[int, str, str, int]] = set()
        try:
            while proc.poll() is None:
                seen |= _listening(root)
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    controller_log = run_dir / "sockets" / "logs" / "controller.log"
    opened = [json.loads(line) for line in controller_log.read_text().splitlines()
              if "weight group opened" in line]
    assert opened and opened[0]["address"].startswith("127.0.0.1:"), opened
    store_port = int(opened[0]["address"].rsplit(":", 1)[1])
    assert any(port == store_port for _, _, _, port in seen), (store_port, sorted(seen))  # store sampled
    assert len({pid for pid, *_ in seen}) >= 4, sorted(seen)  # controller, rollout, reward, learner
    elsewhere = sorted(s for s in seen if s[2] != "127.0.0.1")
    assert not elsewhere, elsewhere
