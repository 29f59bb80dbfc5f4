"""`rlfleet env check` checks the contract's decided points (issue 32): health Watch, a Start of an
episode still running, Start's done and reward, observations with messages or text, an empty
arguments_json, End after a failed call, token refusal; against the Python SDK's server (passes) and a
server that breaks them (fails, saying how)."""
from __future__ import annotations

import pytest

from rlfleet.app.env_check import FAIL, NA, PASS, WARN, check_server
from rlfleet.app.env_sdk import serve
from rlfleet.rpc.security import Security
from tests.env_servers import start as start_faulty

pytestmark = pytest.mark.service
DECIDED = ("health Watch", "Start of a running episode", "empty arguments_json", "deadline")


def by_name(checks):
    return {c.name: c for c in checks}


def test_the_sdk_server_passes_the_decided_points_twice_in_a_row():
    with serve("digits_game", block=False) as server:
        first = by_name(check_server(server.address))
        second = by_name(check_server(server.address))  # a second check never reuses an episode id
    for checks in (first, second):
        assert [n for n, c in checks.items() if c.result == FAIL] == []
        for name in DECIDED:
            assert checks[name].result == PASS, checks[name]
        assert checks["token refused (with a token)"].result == NA
        assert checks["NOT_SERVING on SIGTERM (--stop)"].result == NA
    assert "End(failed) answered" in first["deadline"].detail or "answered within" in first["deadline"].detail


def check_faulty(fault: str) -> dict:
    server, _ = start_faulty(fault)
    try:
        return by_name(check_server(server.address))
    finally:
        server.stop(grace_s=0)


def test_a_server_that_breaks_the_decided_points_is_told_how():
    """What the rollout copes with (a reward on Start is ignored, the text of an observation with both
    fields is used, it never reuses an id nor sends an empty arguments_json) is a WARN naming the
    revision that decided it (issue 42); what fails episodes is a FAIL."""
    checks = check_faulty("lax_start")
    assert checks["health Watch"].result == PASS
    assert checks["one episode"].result == WARN
    assert "Start answered a reward" in checks["one episode"].detail
    checks = check_faulty("both_obs")
    assert checks["one episode"].result == WARN and "both messages and text" in checks["one episode"].detail
    checks = check_faulty("lax_ids")
    assert checks["one episode"].result == PASS
    assert checks["Start of a running episode"].result == WARN
    assert "answered ok=true" in checks["Start of a running episode"].detail
    assert checks["empty arguments_json"].result == WARN
    assert "INVALID_ARGUMENT" in checks["empty arguments_json"].detail


def test_a_server_with_a_token_is_checked_to_refuse_calls_without_it():
    security = Security(token="the-token-0123456789abcdef")
    with serve("digits_game", block=False, security=security) as server:
        checks = by_name(check_server(server.address, security=security))
    refused = checks["token refused (with a token)"]
    assert refused.result == PASS and refused.detail == "UNAUTHENTICATED with no token and with another token"
    assert [n for n, c in checks.items() if c.result == FAIL] == []
