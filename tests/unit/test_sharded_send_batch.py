"""The sharded learner's batch broadcast (services/learner/distributed.py send_batch / receive_batch) over
2 gloo processes on the CPU: a batch whose samples hold the data plane's numpy views (int32 prompt and
response ids, float32 log-probs, as the learner's Train call makes them: rlfleet/dataplane/plane.py
payload_views, rlfleet/rpc/convert.py train_batch_from_proto) reaches rank 1 with the same bits as the
same batch made of Python lists (the inline path), loss masks and their absence included."""
from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlfleet.dataplane.payload import TokenPayload, to_table
from rlfleet.dataplane.plane import payload_refs, payload_views
from rlfleet.dataplane.staging import StagingStore, staged_key
from rlfleet.rpc.convert import train_batch_from_proto, train_batch_to_proto
from rlfleet.types import PayloadRef, TrainBatch, TrainSample

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

A = "10.0.0.1:7001"
# float32-exact log-probs (what the data plane holds): both paths must give rank 1 these bits
GROUPS = {"p0-s0": [TokenPayload([5, 6, 151_000], [-0.5, -0.25, -1.0e-3], 2),
                    TokenPayload([8, 9], [-2.0, -0.125], 2)],
          "p1-s1": [TokenPayload([4], [-3.0], 2, 3)]}
PROMPTS = {"p0-s0": [1, 2, 70_000], "p1-s1": [3]}
# (group, sample, advantage, reward, loss mask sent by the controller)
ROWS = [("p0-s0", 0, 0.5, 1.0, [1, 0, 1]), ("p0-s0", 1, -0.5, 0.0, None), ("p1-s1", 0, 0.25, 0.5, None)]


def batches() -> tuple[TrainBatch, TrainBatch]:
    """(the batch as the data plane makes it: numpy views, the same batch of Python lists)."""
    store = StagingStore(max_tokens=100)
    store.put_table(to_table(GROUPS), A)
    refs = [TrainSample(PROMPTS[rid], [], [], adv, 2, rew, mask, PayloadRef(A, rid, j))
            for rid, j, adv, rew, mask in ROWS]
    request = train_batch_to_proto(TrainBatch(7, refs, 0.9, 6))
    groups = {key: g.columns for key, g in store.staged([staged_key(A, rid) for rid in GROUPS]).items()}
    views = train_batch_from_proto(request, payload_views(payload_refs(request), groups, vocab_size=151_936))
    inline = [TrainSample(PROMPTS[rid], list(GROUPS[rid][j].token_ids), list(GROUPS[rid][j].logprobs), adv, 2,
                          rew, mask) for rid, j, adv, rew, mask in ROWS]
    lists = train_batch_from_proto(train_batch_to_proto(TrainBatch(7, inline, 0.9, 6)))
    return views, lists


def _bits(batch: TrainBatch) -> tuple:
    """Every value rank 1 trains on, floats as their float64 bits."""
    def f64(values) -> bytes:
        return struct.pack(f"<{len(values)}d", *values)
    return (batch.step, batch.expected_version, f64([batch.temperature]),
            [(s.prompt_ids, s.response_ids, f64(s.behaviour_logprobs), f64([s.advantage, s.reward]),
              s.generation_version, s.loss_mask) for s in batch.samples])


def _rank(rank: int, store_file: str, out: str) -> None:
    from services.learner.distributed import LearnerWorld, receive_batch, receive_command, send_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    cpu = torch.device("cpu")
    world = LearnerWorld(rank, 2, rank, cpu, cpu)
    try:
        if rank == 0:
            views, lists = batches()
            assert isinstance(views.samples[0].prompt_ids, np.ndarray)  # the data plane's form is sent
            assert views.samples[0].behaviour_logprobs.dtype == np.float32
            send_batch(world, views)
            send_batch(world, lists)
        else:
            received = [receive_batch(world, receive_command(world)[1]) for _ in range(2)]
            Path(out).write_bytes(pickle.dumps([_bits(b) for b in received]))
    finally:
        dist.destroy_process_group()


def test_numpy_columns_reach_the_other_rank_with_the_bits_of_lists(tmp_path: Path) -> None:
    out = tmp_path / "received.pkl"
    mp.start_processes(_rank, args=(str(tmp_path / "store"), str(out)), nprocs=2, join=True,
                       start_method="spawn")
    from_views, from_lists = pickle.loads(out.read_bytes())
    assert from_views == from_lists
    _, lists = batches()
    sent = _bits(lists)  # and those are the batch's own values
    assert from_lists[:3] == sent[:3] and [s[:5] for s in from_lists[3]] == [s[:5] for s in sent[3]]
    # the masks: as sent where the controller sent one, all ones where it sent none
    assert [s[5] for s in from_views[3]] == [[1, 0, 1], [1, 1], [1]]
