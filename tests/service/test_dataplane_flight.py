"""The data plane on Arrow Flight (rlfleet/dataplane/flight.py), in process: a replica's server serves
its store, the learner's client fetches groups by id and releases them; a group not held is named;
behind TLS with the token, a caller without the token or the fleet's CA is refused, and a server that
is gone reads as unreachable (so the controller re-queues what it held)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlfleet.errors import InvalidRequest, ServiceUnavailable
from rlfleet.rpc.security import Security
from rlfleet.dataplane.flight import PayloadClient, PayloadServer
from rlfleet.dataplane.payload import TokenPayload
from rlfleet.dataplane.store import MemoryStore, PayloadMissing
from tests.tls_certs import Pki, make_pki

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

TOKEN = "data-plane-token-0123456789"
GROUPS = {"p0-s0": [TokenPayload([1, 2, 3], [-0.5, -0.25, -1.0], 2)],
          "p1-s1": [TokenPayload([4], [-2.0], 2, 3), TokenPayload([5, 6], [-0.125, -4.0], 2, 3, [1, 0])]}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _serve(security: Security | None = None) -> PayloadServer:
    store = MemoryStore()
    for rid, payloads in GROUPS.items():
        store.put(rid, payloads)
    return PayloadServer(store, security=security)


@pytest.fixture
def plain() -> Iterator[PayloadServer]:
    server = _serve()
    yield server
    server.shutdown()


def test_fetch_returns_the_groups_asked_and_release_forgets_them(plain):
    client = PayloadClient(timeout_s=10)
    got = client.fetch(plain.address, ["p1-s1", "p0-s0"])
    assert got == GROUPS and list(got) == ["p1-s1", "p0-s0"]
    assert client.release(plain.address, ["p0-s0", "never-held"]) == 1
    assert plain.store.held() == ["p1-s1"]
    with pytest.raises(PayloadMissing, match=r"1 group\(s\) not held here: \['p0-s0'\]"):
        client.fetch(plain.address, ["p0-s0", "p1-s1"])
    client.close()


def test_a_server_that_is_gone_is_unreachable():
    server = _serve()
    address = server.address
    server.shutdown()
    with pytest.raises(ServiceUnavailable, match=f"data plane fetch at {address}"):
        PayloadClient(timeout_s=5).fetch(address, ["p0-s0"])


@pytest.fixture(scope="module")
def secured(pki: Pki) -> Iterator[PayloadServer]:
    server = _serve(Security(cert=pki.server_cert.read_bytes(), key=pki.server_key.read_bytes(),
                             ca=pki.ca.read_bytes(), require_client_cert=True, token=TOKEN))
    yield server
    server.shutdown()


def _client(pki: Pki, token: str | None = TOKEN, ca: bytes | None = None) -> PayloadClient:
    return PayloadClient(Security(cert=pki.client_cert.read_bytes(), key=pki.client_key.read_bytes(),
                                  ca=ca or pki.ca.read_bytes(), token=token), timeout_s=10)


def test_tls_and_the_token_admit_the_fleet(secured, pki):
    assert _client(pki).fetch(secured.address, ["p0-s0"]) == {"p0-s0": GROUPS["p0-s0"]}


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_a_caller_without_the_token_is_refused(secured, pki, token):
    with pytest.raises(InvalidRequest, match="refused: .*the data plane needs the fleet's token"):
        _client(pki, token=token).fetch(secured.address, ["p0-s0"])
    with pytest.raises(InvalidRequest, match="refused"):
        _client(pki, token=token).release(secured.address, ["p0-s0"])
    assert "p0-s0" in secured.store.held()


def test_a_caller_that_does_not_trust_the_server_is_not_served(secured, pki):
    rogue_ca = pki.rogue_cert.read_bytes()  # not the CA that signed the server's certificate
    with pytest.raises(ServiceUnavailable, match="data plane fetch"):
        _client(pki, ca=rogue_ca).fetch(secured.address, ["p0-s0"])
