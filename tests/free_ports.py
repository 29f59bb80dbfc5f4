"""Ports for servers that a test names before they exist (a controller's port that a joiner is given
before the controller binds it, a server restarted on the port it had).

A port taken with bind(0) and closed again comes from the kernel's ephemeral range, which every
outgoing connection and every other bind(0) on the machine also draw from: with tests running in
parallel, one of them can take it before the server binds it. These come from below that range (free
when picked, at random), which only an explicit bind can take."""
from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_for_later(host: str = "127.0.0.1") -> int:
    """A port free now, outside the ephemeral range when there is room below it."""
    top = _ephemeral_start()
    for _ in range(200) if top - LOWEST > 1000 else ():
        port = random.randrange(LOWEST, top)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no room below the ephemeral range: any free port
        sock.bind((host, 0))
        return sock.getsockname()[1]
