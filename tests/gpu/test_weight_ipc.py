"""The one-GPU weight handoff (CUDA IPC, rlfleet.weights.ipc) between two processes on one GPU:
bit-exact after every version (including a layout change), a wrong version refused on the
receiver with the sender unharmed, and a process without the weight-group token gets nothing.

`pytest -m gpu tests/gpu/test_weight_ipc.py` on a machine with a GPU.
"""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tests.gpu.push_weights import push_weights

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


# (version pushed, version the receiver expects, layers): the layout changes at v3, v4 is unexpected
PLAN = [(1, 1, 30), (2, 2, 30), (3, 3, 31), (4, 9, 31), (5, 5, 31)]


def _rank(rank: int, address_q, out_q, token: str | None, joiner_token: str | None) -> None:
    from rlfleet.errors import VersionMismatch, WeightSyncError
    from rlfleet.weights import WeightGroup
    from rlfleet.weights.digest import weights_digest
    from rlfleet.weights.ipc import IpcWeightReceiver, IpcWeightSender

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    try:
        group = (WeightGroup.host(2, backend="gloo", timeout_s=20, device="cpu", token=token) if rank == 0
                 else WeightGroup.join(address_q.get(timeout=60), 1, 2, backend="gloo", timeout_s=20,
                                       device="cpu", token=joiner_token))
        if rank == 0:
            address_q.put(group.address)
        results: list = []
        with group:
            group.connect()
            sender = IpcWeightSender(group, device) if rank == 0 else None
            receiver = IpcWeightReceiver(group, device) if rank else None
            for version, expected, layers in PLAN:
                if sender is not None:
                    named = push_weights(version, layers, device)
                    stats = sender.push(named, version)
                    results.append((weights_digest(named), stats["manifest_bytes"] > 0, stats["transport"]))
                else:
                    try:
                        got = receiver.receive(expected_version=expected)
                        results.append((weights_digest(got.tensors.items()), None, None))
                    except VersionMismatch as exc:
                        results.append(("refused", str(exc), None))
        out_q.put((rank, results))
    except WeightSyncError as exc:
        out_q.put((rank, f"WeightSyncError: {exc}"))


def _run(token: str | None, joiner_token: str | None) -> dict:
    ctx = mp.get_context("spawn")
    address_q, out_q = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, address_q, out_q, token, joiner_token)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = dict(out_q.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return results


@pytest.mark.parametrize("token", [None, "s3cret"], ids=["open", "token"])
def test_ipc_handoff_is_bit_exact_and_refuses_a_wrong_version(token) -> None:
    results = _run(token, token)
    sent, got = results[0], results[1]
    assert [s[2] for s in sent] == ["ipc"] * len(PLAN)
    # the layout goes out with the first push and again only when it changes (v3)
    assert [s[1] for s in sent] == [True, False, True, False, False]
    for (version, expected, _), (digest, _, _), received in zip(PLAN, sent, got):
        if version == expected:
            assert received[0] == digest, f"version {version} differs after the handoff"
        else:
            assert received[0] == "refused" and f"expected weights version {expected}" in received[1]


def test_a_process_without_the_token_gets_no_handle() -> None:
    results = _run("s3cret", None)
    assert isinstance(results[0], str) and "did not present the weight-group token" in results[0]
    assert isinstance(results[1], str) and "refused" in results[1]
