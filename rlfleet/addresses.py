"""`host:port` addresses given in a job's config, checked when the config is read.

`127.0.0.1:notaport` used to be refused only after the controller had waited
`controller.connect_timeout_s` for it; a config value that can never be reached is
a config error, named by its key.
"""
from __future__ import annotations


def check_address(address: str) -> str:
    """Returns `address` if it is `host:port` (port 1..65535; IPv6 hosts in brackets), else
    ValueError saying what is wrong (pydantic names the key)."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected host:port, got {address!r}")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the port of {address!r} must be a number in 1..65535")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"an IPv6 host goes in brackets: [{host}]:{port}")
    return address.strip()
