"""TLS, mutual TLS and the bearer token on real in-process servers; the weight group's token check.

The three services run behind mutual TLS with a token (certificates from tests/tls_certs.py,
made per module). Every RPC of every service is called by clients that lack one piece:
no token, a wrong token, no client certificate, a certificate from an untrusted CA, plain
text. Each is refused (UNAUTHENTICATED, or UNAVAILABLE when the handshake fails), and the
request never reaches the servicer, while the health service stays reachable for a TLS
client without a token and the fully authenticated client gets answers.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from rlfleet.config import JobConfig, LearnerConfig, load_config
from rlfleet.errors import ConfigError, WeightSyncError
from rlfleet.proto.v1 import common_pb2, reward_pb2
from rlfleet.rpc import security as rpc_security
from rlfleet.rpc.channel import open_channel
from rlfleet.rpc.security import Security, secure_channel
from rlfleet.rpc.server import ServiceServer
from rlfleet.security_config import SecurityConfig
from rlfleet.weights import WeightGroup
from services.learner.learner import Learner
from services.reward.scorer import RewardScorer
from services.rollout.engines.hf import HFEngine
from tests.service.servicer_harness import ROLES
from tests.tls_certs import Pki, make_pki

pytestmark = [pytest.mark.service, pytest.mark.timeout(90)]

TOKEN = "test-token-0123456789abcdef"
TIMEOUT = 10


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def server_security(pki: Pki) -> Security:
    return Security(cert=pki.server_cert.read_bytes(), key=pki.server_key.read_bytes(),
                    ca=pki.ca.read_bytes(),
                    require_client_cert=True, token=TOKEN)


def client_security(pki: Pki, token: str | None = TOKEN, cert: Path | None = None, key: Path | None = None,
                    ca: Path | None = None) -> Security:
    cert, key = cert or pki.client_cert, key or pki.client_key
    return Security(cert=cert.read_bytes(), key=key.read_bytes(), ca=(ca or pki.ca).read_bytes(), token=token)


class Served:
    def __init__(self, role: str, server: ServiceServer, servicer: object):
        self.role, self.server, self.servicer = role, server, servicer
        self.service = ROLES[role].service_name

    @property
    def address(self) -> str:
        return self.server.address


@pytest.fixture(scope="module")
def served(pki: Pki, tiny_model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Served]]:
    cores = {
        "reward": RewardScorer("tests.reward_fixtures:score"),
        "rollout": HFEngine(tiny_model_dir, torch.device("cpu"), torch.float32, max_batch_sequences=4),
        "learner": Learner(LearnerConfig(lr=1e-3), tiny_model_dir, torch.device("cpu"), torch.float32,
                           tmp_path_factory.mktemp("ckpt"), seed=0),
    }
    running = []
    for role, core in cores.items():
        spec = ROLES[role]
        servicer = spec.servicer_cls()
        server = ServiceServer([spec.service_name], "127.0.0.1", 0, max_workers=4,
                               security=server_security(pki))
        server.add(spec.add_fn, servicer)
        server.start()
        servicer.attach(core)
        server.mark_serving()
        running.append(Served(role, server, servicer))
    yield running
    for s in running:
        s.server.stop(grace_s=0)


def methods(service_full_name: str) -> list[tuple[str, bool]]:
    """(path, server_streaming) of every RPC of one rlfleet service, read from its descriptor."""
    from google.protobuf import descriptor_pool

    service = descriptor_pool.Default().FindServiceByName(service_full_name)
    return [(f"/{service_full_name}/{m.name}", m.server_streaming) for m in service.methods]


def call_raw(channel: grpc.Channel, path: str, streaming: bool, payload: bytes = b"") -> None:
    if streaming:
        list(channel.unary_stream(path)(payload, timeout=TIMEOUT))
    else:
        channel.unary_unary(path)(payload, timeout=TIMEOUT)


def refusal(channel: grpc.Channel, path: str, streaming: bool) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call_raw(channel, path, streaming)
    return info.value.code()


def health(channel: grpc.Channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT).status


def test_every_rpc_refuses_callers_without_the_token(served, pki):
    for s in served:
        for token in (None, "wrong-token-0123456789abcdef"):
            with secure_channel(s.address, client_security(pki, token=token)) as channel:
                before = s.servicer.metrics.in_flight_now()
                for path, streaming in methods(s.service):
                    code = refusal(channel, path, streaming)
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (s.role, path)
                # Reflection needs the token too; health does not.
                with pytest.raises(grpc.RpcError) as info:
                    ProtoReflectionDescriptorDatabase(channel).get_services()
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert health(channel) == health_pb2.HealthCheckResponse.SERVING, s.role
                # Refused before the servicer: nothing ran, nothing was remembered as an error.
                assert s.servicer.metrics.in_flight_now() == before
                assert s.servicer.last_error == ""


@pytest.mark.parametrize("client", ["untrusted certificate", "no client certificate", "plaintext",
                                    "server not trusted"])
def test_every_rpc_refuses_untrusted_transport(served, pki, client):
    for s in served:
        if client == "plaintext":
            channel = grpc.insecure_channel(s.address)
        elif client == "no client certificate":
            channel = grpc.secure_channel(s.address, grpc.ssl_channel_credentials(pki.ca.read_bytes()))
        elif client == "untrusted certificate":
            channel = secure_channel(s.address, client_security(pki, cert=pki.rogue_cert, key=pki.rogue_key))
        else:  # the client trusts another CA than the one that signed the server's certificate
            channel = secure_channel(s.address, client_security(pki, ca=pki.rogue_cert))
        with channel:
            for path, streaming in [*methods(s.service), ("/grpc.health.v1.Health/Check", False)]:
                code = refusal(channel, path, streaming)
                assert code == grpc.StatusCode.UNAVAILABLE, (client, s.role, path)


def test_authenticated_client_is_served(served, pki):
    for s in served:
        with open_channel(s.address, client_security(pki)) as channel:
            assert health(channel) == health_pb2.HealthCheckResponse.SERVING
            assert s.service in ProtoReflectionDescriptorDatabase(channel).get_services()
            stub = ROLES[s.role].stub_cls(channel)
            status = stub.GetStatus(common_pb2.GetStatusRequest(), timeout=TIMEOUT)
            assert status.role == s.role and status.ready
            if s.role == "reward":
                reply = stub.Score(reward_pb2.ScoreRequest(items=[reward_pb2.ScoreItem(
                    id="a", data_source="custom", response="4", ground_truth="4")]), timeout=TIMEOUT)
                assert reply.results[0].ok and reply.results[0].score == 1.0


def test_security_from_config_reaches_channels_and_health_cli(served, pki, tmp_path):
    """The job's `security`, built once by an entry point and passed on, reaches open_channel and
    `rlfleet health`; nothing is left behind for the rest of the process."""
    from rlfleet.app import health_cli

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cfg = load_config(None, [f"security.tls_cert={pki.client_cert}", f"security.tls_key={pki.client_key}",
                             f"security.tls_ca={pki.ca}", "security.require_client_cert=true",
                             f"security.token_file={token_file}"])
    reward = next(s for s in served if s.role == "reward")
    assert health_cli.check(reward.address) == "UNREACHABLE"  # plain gRPC: the handshake fails
    security = Security.from_config(cfg.security, cfg.limits)
    assert security.token == TOKEN
    assert health_cli.check(reward.address, security=security) == "SERVING"
    with open_channel(reward.address, security) as channel:
        assert ROLES["reward"].stub_cls(channel).GetStatus(common_pb2.GetStatusRequest(),
                                                           timeout=TIMEOUT).ready
    assert health_cli.check(reward.address) == "UNREACHABLE"  # no process-wide security was set
    assert not hasattr(rpc_security, "use") and not hasattr(rpc_security, "current")


def test_reward_sources_use_the_fleet_security_unless_told_not_to(served, pki):
    """A reward source reaches the mTLS reward service with the fleet's security (given to it); a source
    with fleet_security=false talks plain gRPC (and sends no token) to a server outside the fleet."""
    from services.reward.sources.remote_client import RemoteSource
    from rlfleet.reward_config import RewardSourceConfig
    from rlfleet.types import ScoreItem

    item = ScoreItem(id="a", data_source="custom", prompt="p", response="4", ground_truth="4")
    secured = next(s for s in served if s.role == "reward")
    spec = ROLES["reward"]
    plain_servicer = spec.servicer_cls()
    plain_server = ServiceServer([spec.service_name], "127.0.0.1", 0, max_workers=2, security=Security())
    plain_server.add(spec.add_fn, plain_servicer)
    plain_server.start()
    plain_servicer.attach(RewardScorer("tests.reward_fixtures:score"))
    plain_server.mark_serving()
    sources = []
    fleet = Security.from_config(SecurityConfig(tls_cert=str(pki.client_cert), tls_key=str(pki.client_key),
                                                tls_ca=str(pki.ca), require_client_cert=True, token=TOKEN))
    try:
        sources.append(RemoteSource(RewardSourceConfig(name="fleet", address=secured.address),
                                    secured.address,
                                    connect_timeout_s=10, security=fleet))
        sources.append(RemoteSource(RewardSourceConfig(name="outside", address=plain_server.address,
                                                       fleet_security=False), plain_server.address,
                                    connect_timeout_s=10, security=fleet))
        for source in sources:
            [result] = source.score([item])
            assert result.ok and result.score == 1.0, (source.name, result)
    finally:
        for source in sources:
            source.close()
        plain_server.stop(grace_s=0)


def test_security_config_checks():
    with pytest.raises(ConfigError, match="tls_cert and security.tls_key"):
        load_config(None, ["security.tls_cert=/x.pem"])
    with pytest.raises(ConfigError, match="require_client_cert"):
        load_config(None, ["security.require_client_cert=true"])
    with pytest.raises(ConfigError, match="security.token"):
        load_config(None, ["security.token=short"])
    with pytest.raises(ConfigError, match="cannot read"):
        Security.from_config(SecurityConfig(token_file="/no/such/token"))
    # Every service and the controller bind loopback unless told otherwise.
    cfg = JobConfig()
    assert {cfg.rollout.host, cfg.reward.host, cfg.learner.host, cfg.controller.host} == {"127.0.0.1"}


def test_services_bind_loopback_by_default():
    import socket

    server = ServiceServer(["x"], JobConfig().reward.host, 0, max_workers=1, security=Security())
    try:
        server.start()
        assert server.address.startswith("127.0.0.1:")
        try:
            infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
            addresses = {info[4][0] for info in infos}
        except OSError:
            addresses = set()
        for address in sorted(a for a in addresses if not a.startswith("127.")):
            # another interface of this machine, if it has one, is not served
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                assert s.connect_ex((address, server.port)) != 0, address
    finally:
        server.stop(grace_s=0)


# ---- the weight group's rendezvous ----------------------------------------------------------------

def _join(address: str, rank: int, token: str | None, errors: dict[int, BaseException],
          world_size: int) -> None:
    try:
        group = WeightGroup.join(address, rank=rank, world_size=world_size, backend="gloo", timeout_s=15,
                                 token=token)
        try:
            group.connect()
            tensor = torch.zeros(3)
            group.broadcast(tensor)
            assert tensor.tolist() == [1.0, 2.0, 3.0]
        finally:
            group.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the test thread
        errors[rank] = exc


def _rendezvous(tokens: dict[int, str | None]) -> tuple[BaseException | None, dict[int, BaseException]]:
    world_size = len(tokens) + 1
    host = WeightGroup.host(world_size=world_size, backend="gloo", timeout_s=15, token=TOKEN)
    errors: dict[int, BaseException] = {}
    threads = [threading.Thread(target=_join, args=(host.address, r, t, errors, world_size))
               for r, t in tokens.items()]
    for t in threads:
        t.start()
    host_error = None
    try:
        host.connect()
        host.broadcast(torch.tensor([1.0, 2.0, 3.0]))
    except WeightSyncError as exc:
        host_error = exc
    for t in threads:
        t.join(30)
    host.close()
    return host_error, errors


def test_weight_group_admits_members_with_the_token():
    host_error, errors = _rendezvous({1: TOKEN, 2: TOKEN})
    assert host_error is None and not errors


@pytest.mark.parametrize("bad_token", [None, "wrong-token-0123456789abcdef"])
def test_weight_group_refuses_a_member_without_the_token(bad_token):
    host_error, errors = _rendezvous({1: TOKEN, 2: bad_token})
    assert isinstance(host_error, WeightSyncError)
    assert "rank(s) [2]" in str(host_error) and "token" in str(host_error)
    # Both members are told and no process group was built: nobody received the weights.
    assert set(errors) == {1, 2}
    assert all(isinstance(e, WeightSyncError) and "refused rank(s) 2" in str(e)
               for e in errors.values()), errors


def test_generate_on_the_event_loop_uses_the_tls_and_the_token(served, pki):
    """RolloutClient.generate_async (the controller's event loop, issue 44) opens its grpc.aio channel
    with the job's TLS and token: served with them, refused without the token."""
    import asyncio

    from controller.clients import RolloutClient
    from rlfleet.types import PromptRequest, SamplingParams

    rollout = next(s for s in served if s.role == "rollout")
    prompts, params = [PromptRequest("p0", [6, 7])], SamplingParams(n=1, max_new_tokens=2)

    async def generate(client: RolloutClient) -> list:
        return [group async for group in client.generate_async(prompts, params)]

    groups = _served_then_refused(RolloutClient, rollout.address, pki, lambda c: asyncio.run(generate(c)))
    assert [g.request_id for g in groups] == ["p0"]


def test_score_on_the_event_loop_uses_the_tls_and_the_token(served, pki):
    """RewardClient.score_async (the controller's event loop, issue 44): its grpc.aio channel carries
    the job's TLS and token, as the blocking score()'s does: served with them, refused without."""
    import asyncio

    from controller.clients import RewardClient
    from rlfleet.types import ScoreItem

    reward = next(s for s in served if s.role == "reward")
    items = [ScoreItem(id="a", data_source="custom", prompt="p", response="4", ground_truth="4")]

    async def score(client: RewardClient) -> list:
        try:
            return await client.score_async(items)
        finally:
            await client.close_streams()

    results = _served_then_refused(RewardClient, reward.address, pki, lambda c: asyncio.run(score(c)))
    assert [(r.id, r.score) for r in results] == [("a", 1.0)]


def _served_then_refused(client_class, address: str, pki: Pki, call):
    """`call(client)` by a client with the job's TLS and token (returns its result), then by one with a
    wrong token, which must be refused UNAUTHENTICATED."""
    from rlfleet.errors import RlfleetError

    client = client_class(address, timeout_s=TIMEOUT, connect_timeout_s=TIMEOUT,
                          security=client_security(pki))
    try:
        result = call(client)
    finally:
        client.close()
    client = client_class(address, timeout_s=TIMEOUT, connect_timeout_s=TIMEOUT,
                          security=client_security(pki, token="wrong-token-0123456789abcdef"))
    try:
        with pytest.raises(RlfleetError, match="UNAUTHENTICATED"):
            call(client)
    finally:
        client.close()
    return result
