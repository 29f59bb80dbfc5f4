"""The controller's Score on its event loop (RewardClient.score_async over grpc.aio, issue 44): the same
results as the blocking call and the same errors, named alike (the reward service unreachable, its
channel closed, a reply that does not match the request), so Recovery waits out an outage the same way."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from controller.clients import RewardClient
from rlfleet.errors import RlfleetError, ServiceUnavailable
from rlfleet.types import ScoreItem
from tests.reward_servers import Behaviour, RunningFaulty

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

ITEMS = [ScoreItem(id=f"g/{k}", data_source="custom", prompt="p", response=str(k % 2), ground_truth="1")
         for k in range(4)]


def client_of(server: RunningFaulty, **kw) -> RewardClient:
    return RewardClient(server.address, timeout_s=30.0, connect_timeout_s=10.0, **kw)


async def score_then_close(client: RewardClient, items: list[ScoreItem]):
    """Scores on a loop of its own, then closes the asyncio channel on that loop (as the run's stop does)."""
    try:
        return await client.score_async(items)
    finally:
        await client.close_streams()


def test_score_async_returns_what_the_blocking_score_returns() -> None:
    server = RunningFaulty()
    client = client_of(server)
    try:
        blocking = client.score(ITEMS)
        assert asyncio.run(score_then_close(client, ITEMS)) == blocking
        assert [r.score for r in blocking] == [0.0, 1.0, 0.0, 1.0]
        assert server.servicer.calls == 2
    finally:
        client.close()
        server.stop()


def test_an_unreachable_reward_service_is_service_unavailable_naming_its_address() -> None:
    server = RunningFaulty()
    client = client_of(server)
    address = server.address
    server.stop()
    try:
        with pytest.raises(ServiceUnavailable, match=rf"reward service at {address}: score failed with"):
            asyncio.run(score_then_close(client, ITEMS))
    finally:
        client.close()


def test_a_failing_score_is_translated_as_the_blocking_one_is() -> None:
    server = RunningFaulty(Behaviour(always_fail=grpc.StatusCode.INTERNAL))
    client = client_of(server)
    try:
        with pytest.raises(RlfleetError) as blocking:
            client.score(ITEMS)
        with pytest.raises(RlfleetError) as on_loop:
            asyncio.run(score_then_close(client, ITEMS))
        assert type(on_loop.value) is type(blocking.value)
        assert str(on_loop.value) == str(blocking.value)
        assert "reward service at" in str(on_loop.value) and "INTERNAL" in str(on_loop.value)
    finally:
        client.close()
        server.stop()


def test_a_reply_that_does_not_match_the_items_is_an_error_naming_the_service() -> None:
    server = RunningFaulty(Behaviour(drop_last=True))
    client = client_of(server)
    try:
        with pytest.raises(RlfleetError, match=rf"at {server.address} returned 3 results for 4"):
            asyncio.run(score_then_close(client, ITEMS))
    finally:
        client.close()
        server.stop()


def test_score_async_on_a_closed_client_is_an_unreachable_service() -> None:
    server = RunningFaulty()
    client = client_of(server)

    async def run() -> None:
        assert len(await client.score_async(ITEMS)) == 4
        client.close()  # the run stops: the channel closes under the loop's calls
        with pytest.raises(ServiceUnavailable, match=rf"reward service at {server.address}.*closed"):
            await client.score_async(ITEMS)

    try:
        asyncio.run(run())
    finally:
        server.stop()
