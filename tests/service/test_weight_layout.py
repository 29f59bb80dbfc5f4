"""The push header: the layout goes on the wire only when it changed, and weights stay bit-exact.

In-process, over gloo: the learner pushes from a thread while the test receives.
"""
from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rlfleet.errors import VersionMismatch, WeightSyncError
from rlfleet.weights import WeightGroup, WeightReceiver, WeightSender, apply_to_module
from rlfleet.weights.naming import model_weights

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


class _Net(torch.nn.Module):
    """Many small tensors in two dtypes, a non-persistent buffer, an int buffer."""

    def __init__(self, layers: int = 6, width: int = 8) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width).bfloat16()
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)


def _randomize(net: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, t in model_weights(net):
            t.copy_(torch.randint(-1000, 1000, t.shape, generator=g) if not t.is_floating_point()
                    else torch.randn(t.shape, generator=g))
    return net


def _bits(named) -> dict[str, bytes]:
    return {n: t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for n, t in named}


@pytest.fixture
def pair() -> Iterator[tuple[WeightGroup, WeightGroup, ThreadPoolExecutor]]:
    learner = WeightGroup.host(2, timeout_s=10)
    worker = WeightGroup.join(learner.address, 1, 2, timeout_s=10)
    with learner, worker, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(learner.connect)
        worker.connect()
        pending.result(timeout=10)
        yield learner, worker, pool


def _sync(pool, sender, receiver, named, version, expected=None):
    pushed = pool.submit(sender.push, named, version)
    try:
        got = receiver.receive(expected_version=expected)
    finally:
        stats = pushed.result(timeout=10)
    return stats, got


@pytest.mark.parametrize("checksums", [True, False])
def test_unchanged_layout_skips_the_manifest_and_stays_bit_exact(pair, checksums: bool) -> None:
    learner, worker, pool = pair
    sender, receiver = WeightSender(learner, bucket_bytes=256, checksums=checksums), WeightReceiver(worker)
    src, dst = _Net(), _randomize(_Net(), 99)
    for version in range(3):
        _randomize(src, version)
        stats, got = _sync(pool, sender, receiver, model_weights(src), version, expected=version)
        assert (stats["manifest_bytes"] > 0) == (version == 0), stats  # the layout goes out once
        assert got.version == version and got.manifest.version == version
        assert all(b.checksum for b in got.manifest.buckets) == checksums
        apply_to_module(dst, got.tensors)
        assert _bits(model_weights(dst)) == _bits(model_weights(src))
    assert stats["buckets"] > 2 and stats["tensors"] == len(model_weights(src))


def test_changed_layout_is_sent_again(pair) -> None:
    learner, worker, pool = pair
    sender, receiver = WeightSender(learner, bucket_bytes=256), WeightReceiver(worker)
    small, big = _randomize(_Net(layers=3), 1), _randomize(_Net(layers=5), 2)
    for net, sent in ((small, True), (small, False), (big, True), (big, False), (small, True)):
        stats, got = _sync(pool, sender, receiver, model_weights(net), 7)
        assert (stats["manifest_bytes"] > 0) == sent
        assert _bits(got.tensors.items()) == _bits(model_weights(net))
    renamed = [(f"x.{n}", t) for n, t in model_weights(small)]  # same shapes, other names
    stats, got = _sync(pool, sender, receiver, renamed, 8)
    assert stats["manifest_bytes"] > 0 and sorted(got.tensors) == sorted(n for n, _ in renamed)


def test_new_group_generation_resends_the_layout(pair) -> None:
    learner, worker, pool = pair
    sender, net = WeightSender(learner, bucket_bytes=256), _randomize(_Net(), 3)
    stats, _ = _sync(pool, sender, WeightReceiver(worker), model_weights(net), 1)
    assert stats["manifest_bytes"] > 0
    stats, _ = _sync(pool, sender, WeightReceiver(worker), model_weights(net), 2)  # a new receiver object
    assert stats["manifest_bytes"] == 0  # the group, not the receiver, remembers the layout
    pending = pool.submit(learner.connect, 1)
    worker.connect(1)
    pending.result(timeout=10)
    stats, got = _sync(pool, sender, WeightReceiver(worker), model_weights(net), 3)
    assert stats["manifest_bytes"] > 0
    assert _bits(got.tensors.items()) == _bits(model_weights(net))


def test_receiver_that_lost_the_layout_breaks_the_group(pair) -> None:
    learner, worker, pool = pair
    sender, receiver, net = WeightSender(learner, bucket_bytes=256), WeightReceiver(worker), _Net()
    _sync(pool, sender, receiver, model_weights(net), 1)
    worker.cache.clear()  # as if this rank had missed the push that carried the layout
    pushed = pool.submit(sender.push, model_weights(net), 2)
    with pytest.raises(WeightSyncError, match="has not seen"):
        receiver.receive()
    with pytest.raises(WeightSyncError):  # the learner times out: nobody drains its buckets
        pushed.result(timeout=20)
    with pytest.raises(WeightSyncError, match="broken"):
        receiver.receive()


def test_reused_buffers_are_overwritten_in_place_and_version_mismatch_still_drains(pair) -> None:
    learner, worker, pool = pair
    sender, receiver = WeightSender(learner, bucket_bytes=256), WeightReceiver(worker, reuse_buffers=True)
    net = _Net()
    _, first = _sync(pool, sender, receiver, model_weights(_randomize(net, 1)), 1)
    ptrs = [b.data_ptr() for b in first.buckets]
    pushed = pool.submit(sender.push, model_weights(_randomize(net, 2)), 2)
    with pytest.raises(VersionMismatch, match="expected weights version 5"):
        receiver.receive(expected_version=5)
    pushed.result(timeout=10)
    _, third = _sync(pool, sender, receiver, model_weights(_randomize(net, 3)), 3, expected=3)
    assert [b.data_ptr() for b in third.buckets] == ptrs  # no allocation per push
    assert _bits(third.tensors.items()) == _bits(model_weights(net))
