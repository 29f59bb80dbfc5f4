"""A controller client whose channel the fleet closed (a replica that rejoined at the same address
after a restart replaces its old member, whose channel is closed) fails as an unreachable service,
naming it, not with grpc's bare ValueError: the thread still waiting on the old member must not take
the controller down (found by tests/deploy/test_compose_run.py: a killed rollout that came back)."""
from __future__ import annotations

import pytest

from controller.clients import RewardClient
from rlfleet.errors import ServiceUnavailable

pytestmark = pytest.mark.service


def test_a_call_on_a_closed_channel_is_an_unreachable_service(reward_server):
    address = reward_server.server.address
    client = RewardClient(address, timeout_s=5.0, connect_timeout_s=5.0)
    assert client.status().ready
    client.close()
    with pytest.raises(ServiceUnavailable, match=rf"reward service at {address}.*closed"):
        client.status()
