"""Every call the controller makes on its event loop (grpc.aio, issue 44) carries the job's token, a
request id (fresh per call, or the one bound in structlog's contextvars) and the step if bound, as the
blocking channel's interceptors add them: a real server with the services' token check
(rlfleet.rpc.security.TokenInterceptor) serves them, and what it received is looked at."""
from __future__ import annotations

import asyncio

import grpc
import pytest
import structlog

from controller.clients import RewardClient, RolloutClient
from rlfleet.errors import RlfleetError
from rlfleet.proto.v1 import reward_pb2, reward_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from rlfleet.rpc.aio_channel import open_aio_channel
from rlfleet.rpc.request_id import REQUEST_ID, STEP
from rlfleet.rpc.security import AUTHORIZATION, Security
from rlfleet.rpc.server import ServiceServer
from rlfleet.types import PromptRequest, SamplingParams, ScoreItem

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

TOKEN = "aio-token-0123456789abcdef"
ITEMS = [ScoreItem(id="a", data_source="custom", prompt="p", response="4", ground_truth="4")]
PROMPTS, PARAMS = [PromptRequest("p0", [6, 7])], SamplingParams(n=1, max_new_tokens=2)


class Recording(reward_pb2_grpc.RewardServicer, rollout_pb2_grpc.RolloutServicer):
    """Reward and rollout that answer at once and keep each call's metadata (only calls the token
    check let through reach them)."""

    def __init__(self) -> None:
        self.received: list[list[tuple[str, str]]] = []

    @property
    def seen(self) -> list[dict[str, str]]:
        return [dict(metadata) for metadata in self.received]

    def Score(self, request, context):
        self.received.append(list(context.invocation_metadata()))
        return reward_pb2.ScoreResponse(results=[reward_pb2.ScoreResult(id=i.id, score=1.0, ok=True)
                                                 for i in request.items])

    def Generate(self, request, context):
        self.received.append(list(context.invocation_metadata()))
        for prompt in request.prompts:
            yield rollout_pb2.GroupResult(request_id=prompt.request_id)


@pytest.fixture
def served():
    recording = Recording()
    server = ServiceServer(["rlfleet.v1.Reward", "rlfleet.v1.Rollout"], "127.0.0.1", 0,
                           security=Security(token=TOKEN))
    server.add(reward_pb2_grpc.add_RewardServicer_to_server, recording)
    server.add(rollout_pb2_grpc.add_RolloutServicer_to_server, recording)
    server.start()
    server.mark_serving()
    yield server.address, recording
    server.stop(grace_s=0)


async def _score_and_generate(address: str, token: str) -> None:
    """Score twice and Generate once on one loop, as the controller does (channels closed after)."""
    security = Security(token=token)
    reward = RewardClient(address, timeout_s=10.0, connect_timeout_s=10.0, security=security)
    rollout = RolloutClient(address, timeout_s=10.0, connect_timeout_s=10.0, security=security)
    try:
        for _ in range(2):
            assert [r.id for r in await reward.score_async(ITEMS)] == ["a"]
        assert [g.request_id async for g in rollout.generate_async(PROMPTS, PARAMS)] == ["p0"]
    finally:
        for client in (reward, rollout):
            await client.close_streams()
            client.close()


def test_every_aio_call_carries_the_token_and_a_fresh_request_id(served):
    address, recording = served
    asyncio.run(_score_and_generate(address, TOKEN))
    assert len(recording.seen) == 3
    assert all(seen[AUTHORIZATION] == f"Bearer {TOKEN}" for seen in recording.seen)
    ids = [seen[REQUEST_ID] for seen in recording.seen]
    assert all(len(i) == 16 for i in ids) and len(set(ids)) == 3, ids  # fresh per call
    assert all(STEP not in seen for seen in recording.seen)


def test_aio_calls_carry_the_bound_request_id_and_step(served):
    address, recording = served
    with structlog.contextvars.bound_contextvars(request_id="req-9", step=12):
        asyncio.run(_score_and_generate(address, TOKEN))
    assert [(s[REQUEST_ID], s[STEP]) for s in recording.seen] == [("req-9", "12")] * 3


def test_an_aio_call_with_the_wrong_token_is_refused(served):
    """The server does check: the same calls with another token never reach the servicer."""
    address, recording = served
    with pytest.raises(RlfleetError, match="UNAUTHENTICATED"):
        asyncio.run(_score_and_generate(address, "another-token-0123456789ab"))
    assert recording.seen == []


def test_a_call_on_the_channel_itself_carries_the_token_whatever_the_caller_passes(served):
    """open_aio_channel's channel adds the headers to every call, a raw one too; a caller's own
    authorization header does not replace the job's token, its own request id is kept."""
    address, recording = served

    async def call() -> None:
        channel = open_aio_channel(address, Security(token=TOKEN))
        try:
            score = channel.unary_unary("/rlfleet.v1.Reward/Score",
                                        request_serializer=reward_pb2.ScoreRequest.SerializeToString,
                                        response_deserializer=reward_pb2.ScoreResponse.FromString)
            await score(reward_pb2.ScoreRequest(), timeout=10,
                        metadata=((AUTHORIZATION, "Bearer forged"), (REQUEST_ID, "mine")))
            async with grpc.aio.insecure_channel(address) as bare:  # no headers: refused
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await bare.unary_unary("/rlfleet.v1.Reward/Score")(b"", timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await channel.close()

    asyncio.run(call())
    [received] = recording.received
    assert [v for k, v in received if k == AUTHORIZATION] == [f"Bearer {TOKEN}"]
    assert [v for k, v in received if k == REQUEST_ID] == ["mine"]
