"""The rollout's environment client after an outage: the first call once the server is back reaches it
(issue 32: 1-3 batches failed with "Connection refused" after the outage was declared over, because the
client's channel was still in gRPC's reconnect backoff)."""
from __future__ import annotations

import pytest

from rlfleet.app.env_sdk import serve
from rlfleet.env.types import EpisodeRow
from services.rollout.env_client import EnvClient

pytestmark = pytest.mark.service
ROW = dict(data_source="digits_reverse", prompt="Reverse the digits: 12", ground_truth="21")


def test_the_first_call_after_the_server_restarts_reaches_it():
    server = serve("digits_game", block=False)
    port = int(server.address.rsplit(":", 1)[1])
    client = EnvClient(server.address, timeout_s=10.0)
    try:
        [first], _ = client.start([EpisodeRow(episode_id="a", **ROW)])
        assert first.ok
        server.stop(grace_s=0)
        [down], _ = client.start([EpisodeRow(episode_id="b", **ROW)])
        assert not down.ok and down.failure == "unavailable"
        server = serve("digits_game", port=port, block=False)  # back on the same port
        # The call right after: a channel left in reconnect backoff fails it UNAVAILABLE for up to
        # a second (more after longer outages); the client reconnects first.
        [back], _ = client.start([EpisodeRow(episode_id="c", **ROW)])
        assert back.ok, back.error
    finally:
        client.close()
        server.stop(grace_s=0)
