"""Weight pushes over NCCL between two GPUs: bit-exact after every push, header-only pushes
while the layout holds, the full layout again when it changes.

`pytest -m gpu tests/gpu/test_weight_sync_nccl.py` on a machine with two GPUs.
"""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tests.gpu.push_weights import push_weights

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


PLAN = [(1, 30), (2, 30), (3, 30), (4, 31), (5, 31)]  # (version, layers): the layout changes at v4


def _rank(rank: int, address_q, out_q, token) -> None:
    from rlfleet.weights import WeightGroup, WeightReceiver, WeightSender
    from rlfleet.weights.digest import weights_digest

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    group = (WeightGroup.host(2, backend="nccl", timeout_s=60, device=device, token=token) if rank == 0
             else WeightGroup.join(address_q.get(timeout=60), 1, 2, backend="nccl", timeout_s=60,
                                   device=device, token=token))
    if rank == 0:
        address_q.put(group.address)
    results = []
    with group:
        group.connect()
        sender = WeightSender(group, bucket_bytes=64 << 10, checksums=False) if rank == 0 else None
        receiver = WeightReceiver(group, reuse_buffers=True) if rank else None
        for version, layers in PLAN:
            if sender is not None:
                named = push_weights(version, layers, device)
                stats = sender.push(named, version)
                results.append((weights_digest(named), stats["manifest_bytes"]))
            else:
                got = receiver.receive(expected_version=version)
                results.append((weights_digest(got.tensors.items()), None))
    out_q.put((rank, results))


@pytest.mark.parametrize("token", [None, "s3cret"], ids=["open", "token"])  # token: the sealed rendezvous
def test_nccl_push_is_bit_exact_and_sends_the_layout_only_on_change(token) -> None:
    ctx = mp.get_context("spawn")
    address_q, out_q = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, address_q, out_q, token)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = dict(out_q.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    sent, got = results[0], results[1]
    assert [d for d, _ in got] == [d for d, _ in sent]
    assert [m > 0 for _, m in sent] == [True, False, False, True, False]
