"""`host:port` addresses given in a job's config, checked when the config is read.

`127.0.0.1:notaport` used to be refused only after the controller had waited
`controller.connect_timeout_s` for it; a config value that can never be reached is
a config error, named by its key.
"""
from __future__ import annotations

MAX_ADDRESS_CHARS = 261  # a 253-character DNS name, ':' and a port, or a bracketed IPv6 address


def check_address(address: str) -> str:
    """Returns `address` if it is `host:port` (port 1..65535; IPv6 hosts in brackets), else
    ValueError saying what is wrong (pydantic names the key)."""
    if len(address) > MAX_ADDRESS_CHARS:
        raise ValueError(f"an address is at most {MAX_ADDRESS_CHARS} characters, got {len(address)}")
    if any(not c.isprintable() or c.isspace() for c in address.strip()):
        raise ValueError(f"an address has no spaces or control characters, got {address!r}")
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected host:port, got {address!r}")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the port of {address!r} must be a number in 1..65535")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"an IPv6 host goes in brackets: [{host}]:{port}")
    return address.strip()
