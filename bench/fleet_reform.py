"""What a replica joining a running fleet costs the weight sync, both ways, in one run.

One learner process and M member processes share a weight group; then a joiner comes. Two ways
to give it the weights and every later version (issue 22, item 3):
  re-form:  at a version boundary the learner opens a new group over M+1 receivers, everyone
            joins, the current version is pushed to all; later versions go in that one broadcast;
  own path: the joiner gets a group of its own (learner + joiner); every later version is pushed
            twice, to the old group and to the joiner's.
Times are from the learner's side until every receiver has applied the version (a one-element
broadcast lines them up afterwards). Usage:
  python bench/fleet_reform.py --members 2 --shape 0.5b --scale 8 --reps 5     # CPU, gloo
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.weight_sync import build  # noqa: E402


def _receive_rounds(group, model, rounds: int, first_version: int) -> None:
    from rlfleet.weights import WeightReceiver, apply_to_module

    receiver = WeightReceiver(group, reuse_buffers=True)
    for i in range(rounds):
        received = receiver.receive(expected_version=first_version + i)
        apply_to_module(model, received.tensors)
        del received
        group.broadcast(torch.zeros(1))


def receiver(_name: str, shape: str, scale: int, inbox, reps: int) -> None:
    """A member (in the first group and the re-formed one) or the joiner (re-formed and own groups)."""
    from rlfleet.weights import WeightGroup

    torch.set_num_threads(1)
    model = build(shape, torch.device("cpu"), scale)
    while True:
        job = inbox.get()
        if job is None:
            return
        address, rank, world, rounds, version = job
        group = WeightGroup.join(address, rank, world, backend="gloo", timeout_s=120,
                                 device=torch.device("cpu"))
        group.connect()
        _receive_rounds(group, model, rounds, version)
        group.close()


def _push_rounds(group, sender, weights, rounds: int, version: int) -> list[float]:
    times = []
    for i in range(rounds):
        t0 = time.perf_counter()
        sender.push(weights, version=version + i)
        group.broadcast(torch.zeros(1))
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    from rlfleet.weights import WeightGroup, WeightSender
    from rlfleet.weights.naming import model_weights

    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--shape", default="0.5b")
    parser.add_argument("--scale", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    inboxes = [ctx.Queue() for _ in range(args.members + 1)]  # the last one is the joiner's
    procs = [ctx.Process(target=receiver, args=(f"r{i}", args.shape, args.scale, q, args.reps))
             for i, q in enumerate(inboxes)]
    for p in procs:
        p.start()
    model = build(args.shape, torch.device("cpu"), args.scale)
    weights = model_weights(model)
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    cpu = torch.device("cpu")

    def open_group(receivers: list, rounds: int, version: int) -> tuple[WeightGroup, float]:
        t0 = time.perf_counter()
        group = WeightGroup.host(1 + len(receivers), backend="gloo", timeout_s=120, device=cpu)
        for rank, inbox in enumerate(receivers, start=1):
            inbox.put((group.address, rank, 1 + len(receivers), rounds, version))
        group.connect()
        return group, time.perf_counter() - t0

    m, reps = args.members, args.reps
    members, joiner = inboxes[:m], inboxes[m]
    # the fleet before the join: M members (the first push warms up and is not counted)
    group, _ = open_group(members, reps + 1, 0)
    push_m = _push_rounds(group, WeightSender(group), weights, reps + 1, 0)[1:]
    group.close()
    # re-form: a new group over M + 1, the current version, then later versions in one broadcast
    group, formed = open_group([*members, joiner], reps + 1, 100)
    sender = WeightSender(group)
    first, *later = _push_rounds(group, sender, weights, reps + 1, 100)
    reform_join, push_m1 = formed + first, later
    group.close()
    # own path: the joiner's own group (learner + joiner); later versions go to both groups
    group, formed = open_group([joiner], reps + 1, 200)
    first, *later_own = _push_rounds(group, WeightSender(group), weights, reps + 1, 200)
    own_join, push_1 = formed + first, later_own
    group.close()
    for inbox in inboxes:
        inbox.put(None)
    for p in procs:
        p.join()
    med = statistics.median
    print(f"fleet join, {args.shape}/{args.scale} ({len(weights)} tensors, {nbytes / 1e6:.1f} MB), "
          f"gloo on CPU, {m} members + 1 joiner, medians of {reps}:")
    print(f"  push to the {m} members before the join:        {med(push_m) * 1e3:8.1f} ms")
    print(f"  re-form: join (new group + current version):    {reform_join * 1e3:8.1f} ms once; "
          f"every later version {med(push_m1) * 1e3:.1f} ms")
    print(f"  own path: join (own group + current version):   {own_join * 1e3:8.1f} ms once; "
          f"every later version {(med(push_m) + med(push_1)) * 1e3:.1f} ms "
          f"({med(push_m) * 1e3:.1f} + {med(push_1) * 1e3:.1f})")


if __name__ == "__main__":
    main()
