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


@pytest.mark.parametrize("streamed_before", [False, True])
def test_a_generate_stream_started_on_a_closed_channel_is_an_unreachable_service(rollout_server,
                                                                                 streamed_before):
    """A re-form leaves a dead member out, closing its channel, just as its generation task is given
    work (issue 34: the fleet simulator at 256 replicas). grpc then raised a bare ValueError in other
    words than for a unary call ("Cannot invoke RPC: Channel closed!"), which stopped the run, and on
    a channel that never carried a stream it crashed the process (a segmentation fault in grpc)."""
    from controller.clients import RolloutClient
    from rlfleet.types import PromptRequest, SamplingParams

    address = rollout_server.server.address
    client = RolloutClient(address, timeout_s=30.0, connect_timeout_s=5.0)
    prompts, params = [PromptRequest("p0", [6, 7])], SamplingParams(n=1, max_new_tokens=2)
    if streamed_before:
        assert len(list(client.generate(prompts, params))) == 1
    client.close()
    with pytest.raises(ServiceUnavailable, match=rf"rollout service at {address}.*closed"):
        list(client.generate(prompts, params))
