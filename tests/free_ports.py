"""Ports for servers that a test names before they exist (a controller's port that a joiner is given
before the controller binds it, a server restarted on the port it had).

A port taken with bind(0) and closed again comes from the kernel's ephemeral range, which every
outgoing connection and every other bind(0) on the machine also draw from: with tests running in
parallel, one of them can take it before the server binds it. These come from below that range (free
when picked, at random), which only an explicit bind can take: another such pick. So no port is handed
out twice by one process (a test names several ports before any server binds one), and each
pytest-xdist worker draws from a slice of the range of its own."""
from __future__ import annotations

import os
import random
import socket
from pathlib import Path

LOWEST = 10000
MIN_SLICE = 1000  # fewer ports than this to draw from: let the kernel pick (bind(0))
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice() -> range:
    """This process's share of [LOWEST, the ephemeral range's start): all of it, or an xdist worker's."""
    low, top = LOWEST, _ephemeral_start()
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if count > 1 and worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < count:
        size = (top - low) // count
        low += int(worker[2:]) * size
        top = low + size
    return range(low, top)


def port_for_later(host: str = "127.0.0.1") -> int:
    """A port free now and not handed out before by this process, from its slice below the ephemeral
    range when the slice has room; else one the kernel picks."""
    ports = _slice()
    for _ in range(200) if len(ports) >= MIN_SLICE else ():
        port = random.choice(ports)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:  # no room below the ephemeral range: any free port
        sock.bind((host, 0))
        return sock.getsockname()[1]
