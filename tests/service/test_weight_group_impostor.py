"""A process without the token cannot take a rank's place in the weight group (issue 15).

The tester's attack, by a real second process: it connects to the learner's store, waits
for the learner's admission verdict on the real rollout's proof, then builds rank 1's gloo
group from the store itself and waits for the weights. Before the fix admission was per
rank slot and the impostor received every tensor. Now the group is built on a rendezvous
sealed with the token, so the impostor gets nothing, and the real rollout receives the
weights. A process that slips into a connection anyway is caught by the channel check.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from rlfleet.errors import WeightSyncError
from rlfleet.weights import WeightGroup
from rlfleet.weights.sealed_store import (
    SealedStore,
    check_channels,
    check_members,
    round_secret,
    sealed_value_key,
)

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

TOKEN = "impostor-test-token-0123456789"
SECRET_WEIGHTS = [3.25, -1.5, 7.0, 42.0]

IMPOSTOR = r"""
import sys
from datetime import timedelta
import torch, torch.distributed as dist
host, port = sys.argv[1].rsplit(":", 1)
store = dist.TCPStore(host, int(port), None, False, timedelta(seconds=30))
round_ = dist.PrefixStore("rlfleet/weights/g0/", store)
print("WAITING", flush=True)
round_.wait(["auth/verdict"], timedelta(seconds=30))
print("VERDICT", round_.get("auth/verdict").decode(), flush=True)
try:
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timedelta(seconds=8)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    pg = dist.ProcessGroupGloo(round_, 1, 2, opts)
    for size in (3, 4):  # the group's hello, then the weights
        t = torch.zeros(size)
        pg.broadcast([t]).wait(timedelta(seconds=8))
        print("RECEIVED", t.tolist(), flush=True)
except Exception as e:
    print("NOTHING", type(e).__name__, flush=True)
"""


def test_an_impostor_process_receives_nothing_and_the_rollout_its_weights(monkeypatch):
    # The real rollout builds its group a moment after the impostor has seen the verdict (a served
    # rollout is busier than this thread), so the impostor acts first, as in the tester's run; without
    # waiting for that, who wins is a race (and on a loaded machine the impostor would come late).
    make_pg = WeightGroup._make_pg
    impostor_lines: list[str] = []
    verdict_seen = threading.Event()

    def slower_rollout(self, store):
        if self.rank == 1:
            verdict_seen.wait(60)
            time.sleep(1.0)
        return make_pg(self, store)

    monkeypatch.setattr(WeightGroup, "_make_pg", slower_rollout)
    host = WeightGroup.host(world_size=2, backend="gloo", timeout_s=20, token=TOKEN)
    impostor = subprocess.Popen([sys.executable, "-c", IMPOSTOR, host.address], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    received: dict[str, object] = {}

    def read_impostor() -> None:
        for line in impostor.stdout:
            impostor_lines.append(line)
            if line.startswith("VERDICT"):
                verdict_seen.set()
        verdict_seen.set()  # it ended without one: the assertions below say so

    def rollout() -> None:
        try:
            with WeightGroup.join(host.address, rank=1, world_size=2, backend="gloo", timeout_s=20,
                                  token=TOKEN) as group:
                group.connect()
                weights = torch.zeros(4)
                group.broadcast(weights)
                received["weights"] = weights.tolist()
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            received["error"] = exc

    try:
        assert impostor.stdout.readline().strip() == "WAITING"  # in place before the round starts
        reader = threading.Thread(target=read_impostor, daemon=True)
        reader.start()
        member = threading.Thread(target=rollout)
        member.start()
        host_error = None
        try:
            host.connect()
            host.broadcast(torch.tensor(SECRET_WEIGHTS))
        except WeightSyncError as exc:
            host_error = exc
        member.join(60)
        impostor.wait(timeout=60)
        reader.join(60)
        out = "".join(impostor_lines)
    finally:
        host.close()
        if impostor.poll() is None:
            impostor.kill()
    assert "VERDICT ok" in out, out  # the impostor saw the real rollout admitted...
    assert "RECEIVED" not in out and "NOTHING" in out, out  # ...and still got nothing
    assert host_error is None, host_error
    assert received == {"weights": SECRET_WEIGHTS}, received


def test_the_sealed_store_names_and_hides_its_entries():
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=5), wait_for_workers=False)
    sealed = SealedStore(store, round_secret(TOKEN, "nonce"))
    sealed.set("0/1", b"tcp://127.0.0.1:45678 seq 1")
    assert sealed.get("0/1") == b"tcp://127.0.0.1:45678 seq 1"
    [name] = store.list_keys()
    assert "0/1" not in name and b"45678" not in store.get(name)  # neither the key nor the address shows
    other = SealedStore(store, round_secret("another-token-0123456789", "nonce"))
    assert not other.check(["0/1"])  # another secret finds another key
    store.set(name, b"x" * 80)  # a value written without the token is refused, not used
    with pytest.raises(WeightSyncError, match="not written by a holder of the token"):
        sealed.get("0/1")


def test_the_sealed_store_uses_a_standard_aead():
    """Issue 22: the values are AES-256-GCM (the `cryptography` package), not a cipher written
    here: a value opens with AESGCM under the round's derived key, bound to its sealed key name,
    and a copy moved under another key name is refused."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=5), wait_for_workers=False)
    secret = round_secret(TOKEN, "nonce")
    sealed = SealedStore(store, secret)
    sealed.set("0/1", b"tcp://127.0.0.1:45678 seq 1")
    [name] = store.list_keys()
    value = store.get(name)
    aead = AESGCM(sealed_value_key(secret))
    assert aead.decrypt(value[:12], value[12:], name.encode()) == b"tcp://127.0.0.1:45678 seq 1"
    store.set(sealed.sealed_name("0/2"), value)  # the right token's value, under another entry
    with pytest.raises(WeightSyncError, match="not written by a holder of the token"):
        sealed.get("0/2")


def _three_gloo_members(prove) -> dict[int, BaseException]:
    """Three ranks of one gloo group, each in a thread, each running `prove(pg, rank)`; their errors."""
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=20), wait_for_workers=False)
    errors: dict[int, BaseException] = {}

    def member(rank: int) -> None:
        client = store if rank == 0 else dist.TCPStore("127.0.0.1", store.port, None, False,
                                                       timedelta(seconds=20))
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timedelta(seconds=20)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        try:
            prove(dist.ProcessGroupGloo(client, rank, 3, opts), rank)
        except WeightSyncError as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=member, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_a_rank_that_got_into_the_group_without_the_secret_is_refused_before_any_weight():
    """As if an impostor had won a race into gloo's listener: the group exists, but its proof fails."""
    good, bad = round_secret(TOKEN, "n"), round_secret("not-the-token-0123456789", "n")
    errors = _three_gloo_members(lambda pg, rank: check_channels(pg, rank, 3, bad if rank == 2 else good, 20))
    assert set(errors) == {0, 1, 2}
    assert "rank(s) [2]" in str(errors[0]) and "rank(s) [2]" in str(errors[1])
    assert "rank(s) [0, 1]" in str(errors[2])


def test_a_member_without_the_secret_is_named_by_the_all_gather_proof():
    """check_members, which NCCL groups use (their rendezvous stays a C++ store): one all-gather of
    tags, here on gloo and the CPU; the rank with another secret is named by every other rank."""
    good, bad = round_secret(TOKEN, "n"), round_secret("not-the-token-0123456789", "n")
    errors = _three_gloo_members(
        lambda pg, rank: check_members(pg, rank, 3, bad if rank == 1 else good, torch.device("cpu"), 20))
    assert set(errors) == {0, 1, 2}
    assert "rank(s) [1]" in str(errors[0]) and "rank(s) [1]" in str(errors[2])
    assert "rank(s) [0, 2]" in str(errors[1])
