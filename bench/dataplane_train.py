"""The Train call's payload, inline (today) against the data plane (issue 44), measured side by side.

A batch of G groups x 16 samples of ~303 response tokens (the simulator's length model, bench/fleetsim;
ids spread over a 151k vocabulary, so varints take 2-3 bytes as with Qwen2.5)
and 40 prompt tokens. Inline: the controller builds the TrainRequest (rlfleet.rpc.convert), serializes
it, the learner parses it and converts it back (what the gRPC path does, without the loopback copy).
Flight: the payloads sit in R replicas' PayloadServers (rlfleet/dataplane, in this process); the
learner fetches each replica's groups in parallel, to Arrow (what a learner that builds tensors from
Arrow needs) and on to Python lists (what today's Learner.train takes); the controller's request then
holds ids, versions and advantages only (its bytes are counted, its conversion is not timed).

The Train call's learner side (services/learner/servicer.py Train up to Learner.train), the batch fetched
against staged: the controller's request of references is parsed, then either every group is fetched
from the R replicas as each group's columns (fetch_columns), or every group was pushed beforehand to the
learner's staging store (rlfleet/dataplane/staging.py, over Flight, split into columns on arrival: timed
apart, as the pushes run while the batch is still generated) and only its columns are picked up; the
samples are given views of them (payload_views); then validate.train and the conversion to the
TrainBatch (each sample made once with its views) as the servicer does. Then what the learner builds
from that batch on the host (services/learner/batching.py: micro-batches of 16k tokens, collated to CPU
tensors, packed), timed apart as `learner_collate_s`.

The staging store's memory per token held: the batch's tables (puts of 64 groups, as pushed) put into a
fresh StagingStore, the tables then dropped; what the store still holds is the growth of Python's heap
(tracemalloc: lists, floats, numpy arrays) plus Arrow's memory pool (buffers tracemalloc does not see),
divided by the response tokens held (`staging_memory`).

    python bench/dataplane_train.py --groups 512 --replicas 16 --out bench/results/x.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from bench.fleetsim.gpu_model import GpuModel  # noqa: E402
from rlfleet.dataplane.columns import columns_of  # noqa: E402
from rlfleet.dataplane.flight import PayloadClient, PayloadServer  # noqa: E402
from rlfleet.dataplane.payload import TokenPayload, from_table, to_table  # noqa: E402
from rlfleet.dataplane.plane import fetch_columns, payload_refs, payload_views  # noqa: E402
from rlfleet.dataplane.staging import StagingStore  # noqa: E402
from rlfleet.dataplane.store import MemoryStore  # noqa: E402
from rlfleet.proto.v1 import learner_pb2, rollout_pb2  # noqa: E402
from rlfleet.rpc import validate  # noqa: E402
from rlfleet.rpc.convert import (group_from_proto, group_to_proto, train_batch_from_proto,  # noqa: E402
                                 train_batch_to_proto, train_prompts_from_proto)
from rlfleet.security_config import LimitsConfig  # noqa: E402
from rlfleet.types import Completion, GroupResult, PayloadRef, TrainBatch, TrainSample  # noqa: E402
from services.learner.batching import collate, split_by_token_budget  # noqa: E402

N = 16
PROMPT = 40
VOCAB = 151_936  # Qwen2.5's
MICRO_BATCH_TOKENS = 16_384


def staging_memory(groups: dict[str, list[TokenPayload]]) -> dict:
    """Bytes the staging store holds per response token, the batch put in as the replicas push it."""
    rids = list(groups)
    gc.collect()
    arrow0 = pa.total_allocated_bytes()  # before the tables: what the store keeps of them is counted
    tables = [to_table({rid: groups[rid] for rid in rids[k:k + 64]}) for k in range(0, len(rids), 64)]
    gc.collect()
    tracemalloc.start()
    heap0 = tracemalloc.get_traced_memory()[0]
    store = StagingStore(max_tokens=10**9)
    for table in tables:
        store.put_table(table, "10.0.0.1:7001")
    del tables, table
    gc.collect()
    heap, arrow = tracemalloc.get_traced_memory()[0] - heap0, pa.total_allocated_bytes() - arrow0
    tracemalloc.stop()
    tokens = store.tokens
    return {"tokens_held": tokens, "python_heap_bytes": heap, "arrow_pool_bytes": arrow,
            "bytes_per_token": (heap + arrow) / tokens}


def learner_collate(batch: TrainBatch) -> float:
    """Seconds to build the learner's CPU tensors from `batch` (micro-batches, padded and packed)."""
    t = time.perf_counter()
    for micro in split_by_token_budget(batch.samples, MICRO_BATCH_TOKENS):
        collate(micro, pad_id=0, device=torch.device("cpu"), pack=True)
    return time.perf_counter() - t


def train_call(groups: dict[str, list[TokenPayload]], replicas: int, prompt: list[int],
               repeat: int = 1) -> dict:
    """The learner's side of a Train call whose groups are fetched, and whose groups are staged; each
    part `repeat` times, the least time reported (`*_runs_s`: all of them): on a machine shared with other
    work the least is the one the others disturbed least."""
    stores = [MemoryStore() for _ in range(replicas)]
    servers = [PayloadServer(st) for st in stores]
    refs = []
    for i, (rid, ps) in enumerate(groups.items()):
        stores[i % replicas].put(rid, ps)
        refs += [(servers[i % replicas].address, rid, j, len(p.token_ids)) for j, p in enumerate(ps)]
    samples = [TrainSample(prompt, [], [], 0.25, 3, payload=PayloadRef(*ref)) for ref in refs]
    wire = train_batch_to_proto(TrainBatch(1, samples, 1.0, 3)).SerializeToString()
    limits = LimitsConfig(max_train_samples=len(samples))
    client = PayloadClient()
    for server, store in zip(servers, stores):  # connected, as a learner's client is after its first step
        client.fetch(server.address, store.held()[:1])

    def learner_side(staging: StagingStore | None) -> tuple[float, TrainBatch]:
        t = time.perf_counter()
        request = learner_pb2.TrainRequest.FromString(wire)
        refs = payload_refs(request)
        staged = staging.staged(refs.groups()) if staging is not None else {}
        _, groups = fetch_columns(refs, client, staged)
        prompts = train_prompts_from_proto(request)
        validate.train(request, limits, VOCAB, prompts)
        groups.update((key, group.columns) for key, group in staged.items())
        batch = train_batch_from_proto(request, payload_views(refs, groups, VOCAB), prompts)
        return time.perf_counter() - t, batch

    runs: dict[str, list[float]] = {"fetched": [], "staging_puts": [], "staged": [], "learner_collate": []}
    staging = PayloadServer(StagingStore(max_tokens=10**9))
    for _ in range(repeat):
        runs["fetched"].append(learner_side(None)[0])
        # the pushes: each replica's groups in puts of 64 (push.py's MAX_PER_PUT) to the staging server
        # (again: each replaces its group, counted once)
        t = time.perf_counter()
        for server, store in zip(servers, stores):
            held = store.held()
            for k in range(0, len(held), 64):
                client.put(staging.address, server.address, store.get(held[k:k + 64]))
        runs["staging_puts"].append(time.perf_counter() - t)
        staged_s, staged = learner_side(staging.store)
        runs["staged"].append(staged_s)
        assert len(staged.samples) == len(samples) and all(s.payload is None for s in staged.samples)
        runs["learner_collate"].append(learner_collate(staged))
        del staged
    for server in [*servers, staging]:
        server.shutdown()
    return {**{f"{name}_s": min(times) for name, times in runs.items()},
            **({f"{name}_runs_s": times for name, times in runs.items()} if repeat > 1 else {}),
            "staged_tokens": staging.store.tokens}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=512)
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=428)
    p.add_argument("--out", default="")
    p.add_argument("--learner-only", action="store_true",
                   help="only the Train call's learner side and the staging store's memory (no inline, "
                        "controller or fetch-to-lists comparison)")
    p.add_argument("--repeat", type=int, default=1, help="runs of the Train call's learner side (least kept)")
    a = p.parse_args()
    rng, gpu = random.Random(0), GpuModel(max_new_tokens=a.max_new_tokens)
    groups = {f"p{g}-s{g}": [TokenPayload([(i * 7919) % 151_000 + 3 for i in range(gpu.response_length(rng))],
                                          [], 3) for _ in range(N)] for g in range(a.groups)}
    groups = {rid: [TokenPayload(s.token_ids, [-0.5 - 1e-3 * (i % 97) for i in range(len(s.token_ids))], 3)
                    for s in ps] for rid, ps in groups.items()}
    tokens = sum(len(s.token_ids) for ps in groups.values() for s in ps)
    prompt = list(range(3, 3 + PROMPT))
    samples = [TrainSample(prompt, s.token_ids, s.logprobs, 0.25, 3) for ps in groups.values() for s in ps]
    if a.learner_only:
        report({"groups": a.groups, "samples": len(samples), "response_tokens": tokens,
                "replicas": a.replicas,
                "train_call_learner_side": train_call(groups, a.replicas, prompt, a.repeat),
                "staging_memory": staging_memory(groups)}, a.out)
        return

    t = time.perf_counter()
    msg = train_batch_to_proto(TrainBatch(1, samples, 1.0, 3))
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    wire = msg.SerializeToString()
    send_s = time.perf_counter() - t
    t = time.perf_counter()
    parsed = learner_pb2.TrainRequest.FromString(wire)
    back = train_batch_from_proto(parsed)
    parse_s = time.perf_counter() - t
    assert len(back.samples) == len(samples)
    inline = {"bytes": len(wire), "build_s": build_s, "serialize_s": send_s, "parse_convert_s": parse_s,
              "total_s": build_s + send_s + parse_s}

    # The controller's own share, per group: parsing a Generate stream message and converting it
    # (rlfleet.rpc.convert), then its part of the Train request; with and without the token payload
    # (the data plane's stream carries text, finish reason and versions only).
    def controller_side(with_tokens: bool) -> float:
        msgs = []
        for rid, ps in groups.items():
            comps = [Completion(s.token_ids if with_tokens else [], s.logprobs if with_tokens else [],
                                "stop", 3, text="The answer is #### 12") for s in ps]
            msgs.append(group_to_proto(GroupResult(rid, comps)).SerializeToString())
        t = time.perf_counter()
        parsed_groups = [group_from_proto(rollout_pb2.GroupResult.FromString(m)) for m in msgs]
        batch = [TrainSample(prompt, c.token_ids, c.logprobs, 0.25, 3) for g in parsed_groups
                 for c in g.completions]
        train_batch_to_proto(TrainBatch(1, batch, 1.0, 3)).SerializeToString()
        return (time.perf_counter() - t) / len(groups)
    controller = {"inline_ms_per_group": 1000 * controller_side(True),
                  "payload_free_ms_per_group": 1000 * controller_side(False)}

    # Flight: each replica holds its share of the groups.
    stores = [MemoryStore() for _ in range(a.replicas)]
    owner = {}
    for i, (rid, ps) in enumerate(groups.items()):
        stores[i % a.replicas].put(rid, ps)
        owner.setdefault(i % a.replicas, []).append(rid)
    servers = [PayloadServer(s) for s in stores]
    client = PayloadClient()
    with ThreadPoolExecutor(max_workers=min(32, a.replicas)) as pool:
        list(pool.map(lambda r: client.fetch(servers[r].address, owner[r][:1]), owner))  # connect
        t = time.perf_counter()
        tables = list(pool.map(lambda r: client.fetch_table(servers[r].address, owner[r]), owner))
        fetch_s = time.perf_counter() - t
    flight_bytes = sum(tb.nbytes for tb in tables)
    t = time.perf_counter()
    fetched = {}
    for tb in tables:
        fetched.update(from_table(tb))
    to_lists_s = time.perf_counter() - t
    t = time.perf_counter()  # what the learner does with them now: each group's checked columns
    assert sum(len(columns_of(tb)) for tb in tables) == len(groups)
    to_columns_s = time.perf_counter() - t
    assert len(fetched) == len(groups)
    # What a learner that packs its rows from Arrow needs: flat ids and log-probs and the row offsets
    # (zero-copy views where the column is one chunk).
    t = time.perf_counter()
    flat = 0
    for tb in tables:
        for name in ("token_ids", "logprobs"):
            column = tb.column(name).combine_chunks()
            flat += column.values.to_numpy().size + column.offsets.to_numpy().size
    to_numpy_s = time.perf_counter() - t
    control = learner_pb2.TrainRequest(step=1, temperature=1.0, expected_version=3)
    for _ in samples:  # what stays on the control plane: ids (a ~12-byte request id), advantage, version
        s = control.samples.add()
        s.advantage, s.generation_version = 0.25, 3
    control_bytes = len(control.SerializeToString()) + 12 * len(samples)
    for s in servers:
        s.shutdown()
    call = train_call(groups, a.replicas, prompt, a.repeat)
    memory = staging_memory(groups)
    result = {"groups": a.groups, "samples": len(samples), "response_tokens": tokens,
              "replicas": a.replicas, "inline": inline, "controller_payload_cpu": controller,
              "train_call_learner_side": call, "staging_memory": memory,
              "flight": {"bytes": flight_bytes, "fetch_to_arrow_s": fetch_s, "arrow_to_lists_s": to_lists_s,
                         "arrow_to_group_columns_s": to_columns_s,
                         "arrow_to_flat_numpy_s": to_numpy_s,
                         "control_request_bytes": control_bytes}}
    report(result, a.out)


def report(result: dict, out: str) -> None:
    result = {**result, "load_avg": os.getloadavg(), "cpus": os.cpu_count()}
    print(json.dumps(result, indent=1))
    if out:
        Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
