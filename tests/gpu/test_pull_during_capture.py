"""A weight pull by CUDA IPC while the rollout captures decode slots, as at max_staleness >= 1 on one GPU
(the pull runs on the weight-sync thread, the capture in the generation thread): every push reaches the
receiver bit-exact, no capture fails, and no push waits out the group timeout.

Seen on the H200 before the fix: the pull's device-wide synchronize landed in a capture, failed with
cudaErrorStreamCaptureUnsupported, left the learner waiting 119 s for an acknowledgement, and the next
generation failed with cudaErrorStreamCaptureInvalidated.

`pytest -m gpu tests/gpu/test_pull_during_capture.py` on a machine with a GPU.
"""
from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest
import torch

from tests.gpu.push_weights import push_weights

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PUSHES = 40
GROUP_TIMEOUT_S = 30


def _capture_until(started: threading.Event, stop: threading.Event, device: torch.device,
                   report: dict) -> None:
    """Capture new decode slots (a new cache shape each time, so each one is captured) until told to stop."""
    try:
        from services.rollout.engines.decoder import StaticDecoder
        from services.rollout.engines.graphs import SlotCache
        from tests.gpu.test_fast_rollout import _model

        torch.cuda.set_device(device)
        slots = SlotCache(StaticDecoder(_model(0)), capture=True, keep=1)
        while not stop.is_set():
            tokens = 64 * (1 + report["captures"] % 8)
            slot = slots.get(8, tokens)
            assert slot.graph is not None
            slot.step()
            report["captures"] += 1
            started.set()
    except BaseException as exc:  # reported to the test, which fails on it
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        started.set()


def _rank(rank: int, address_q, out_q) -> None:
    from rlfleet.devices import CUDA_CAPTURE_EXCLUSIVE
    from rlfleet.errors import WeightSyncError
    from rlfleet.weights import WeightGroup
    from rlfleet.weights.digest import weights_digest
    from rlfleet.weights.ipc import IpcWeightReceiver, IpcWeightSender

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    results: list = []
    report = {"captures": 0, "error": None}
    try:
        group = (WeightGroup.host(2, backend="gloo", timeout_s=GROUP_TIMEOUT_S, device="cpu") if rank == 0
                 else WeightGroup.join(address_q.get(timeout=60), 1, 2, backend="gloo",
                                       timeout_s=GROUP_TIMEOUT_S, device="cpu"))
        if rank == 0:
            address_q.put(group.address)
        with group:
            group.connect()
            if rank == 0:
                sender = IpcWeightSender(group, device)
                for version in range(1, PUSHES + 1):
                    named = push_weights(version, 30, device)
                    start = time.monotonic()
                    try:
                        sender.push(named, version)
                        results.append((weights_digest(named), time.monotonic() - start))
                    except WeightSyncError as exc:
                        results.append((f"failed: {exc}", time.monotonic() - start))
                        break
                    time.sleep(0.02)  # the learner trains between pushes
            else:
                receiver = IpcWeightReceiver(group, device)
                started, stop = threading.Event(), threading.Event()
                capturer = threading.Thread(target=_capture_until, args=(started, stop, device, report),
                                            daemon=True)
                capturer.start()
                started.wait(timeout=120)  # the pulls begin once captures are under way
                try:
                    for version in range(1, PUSHES + 1):
                        try:
                            got = receiver.receive(expected_version=version)
                            # the engine applies (and here hashes) a version under the lock that its
                            # generation, and so every capture, holds: the same lock stands in for it here
                            with CUDA_CAPTURE_EXCLUSIVE:
                                results.append((weights_digest(got.tensors.items()), None))
                        except WeightSyncError as exc:
                            results.append((f"failed: {exc}", None))
                            break
                finally:
                    stop.set()
                    capturer.join(timeout=60)
        out_q.put((rank, results, report))
    except BaseException as exc:  # report, never hang the parent
        out_q.put((rank, results + [(f"crash: {type(exc).__name__}: {exc}", None)], report))


def test_pulls_and_captures_at_once_all_succeed() -> None:
    ctx = mp.get_context("spawn")
    address_q, out_q = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, address_q, out_q)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = {rank: (res, report) for rank, res, report in (out_q.get(timeout=280) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
    (sent, _), (got, report) = results[0], results[1]
    print(f"\n{len(got)} pulls during {report['captures']} captures; longest push "
          f"{max(s for _, s in sent[1:]):.3f} s after the first")
    assert report["error"] is None, report["error"]
    assert report["captures"] >= 10  # the pulls really overlapped captures
    assert [s[0] for s in sent] == [g[0] for g in got] and len(sent) == PUSHES, (sent[-1], got[-1])
    # the first push waits for the receiver to start pulling; none after it may wait out the timeout
    assert max(s for _, s in sent[1:]) < GROUP_TIMEOUT_S / 3
