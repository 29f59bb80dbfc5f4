"""Weight sync learner -> rollout against the raw NCCL broadcast of the same bytes, in one run.

Two processes, one GPU each: rank 0 plays the learner (a Qwen2.5-shaped model with random
bf16 weights), rank 1 the rollout (the same architecture). For each shape it times
  raw:    one torch.distributed broadcast of a flat buffer holding all the weight bytes;
  rlfleet: WeightSender.push -> WeightReceiver.receive -> apply_to_module (what PullWeights
           does), from push start until the receiver has applied the new version;
and prints the ratio. Usage: python bench/weight_sync.py [--shapes 0.5b,1.5b,7b] [--out FILE]

`--device onegpu` puts both ranks on GPU 0, as `rlfleet run` does on a one-GPU host, and times the
CUDA IPC handoff (rlfleet.weights.ipc, push -> applied) against the host round trip over gloo
that one GPU had before (pack to host memory, broadcast, copy back), with one device-to-device
copy of all the bytes as the floor, e.g.
  python bench/weight_sync.py --device onegpu --shapes 135m,0.5b

`--device cpu` runs both ranks on the CPU over gloo, and `--scale N` divides every width
(hidden, intermediate, vocab) by N while keeping the tensor count: the fixed per-push cost
(manifest, one copy per tensor, syncs) shows without a GPU, e.g.
  python bench/weight_sync.py --device cpu --shapes 0.5b --scale 8 --reps 20
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.multiprocessing as mp

CHECKSUMS = os.environ.get("RLFLEET_BENCH_CHECKSUMS", "0") == "1"
SHAPES = {  # Qwen2.5 configs (hidden, intermediate, layers, heads, kv heads, vocab, tied)
    "0.5b": (896, 4864, 24, 14, 2, 151936, True),
    "1.5b": (1536, 8960, 28, 12, 2, 151936, True),
    "7b": (3584, 18944, 28, 28, 4, 152064, False),
    "135m": (576, 1536, 30, 9, 3, 49152, True),  # SmolLM2-135M's shape (Llama; a Qwen2 body here)
}


def build(shape: str, device: torch.device, scale: int = 1) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    h, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    h, inter, vocab = h // scale // heads * heads, inter // scale, vocab // scale  # heads must divide h
    cfg = Qwen2Config(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    return model.eval().requires_grad_(False)


def worker(rank: int, shape: str, address_q, result_q, reps: int, on_cpu: bool, scale: int) -> None:
    from rlfleet.weights import WeightGroup, WeightReceiver, WeightSender, apply_to_module
    from rlfleet.weights.naming import model_weights

    if on_cpu:
        torch.set_num_threads(1)  # two ranks share the machine's cores
        device, backend = torch.device("cpu"), "gloo"
    else:
        torch.cuda.set_device(rank)
        device, backend = torch.device("cuda", rank), "nccl"
    sync = (lambda: None) if on_cpu else torch.cuda.synchronize
    model = build(shape, device, scale)
    weights = model_weights(model)
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    group = (WeightGroup.host(2, backend=backend, timeout_s=120, device=device) if rank == 0
             else WeightGroup.join(address_q.get(), 1, 2, backend=backend, timeout_s=120, device=device))
    if rank == 0:
        address_q.put(group.address)
    group.connect()
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    raw, ours = [], []
    sender = WeightSender(group, checksums=CHECKSUMS) if rank == 0 else None
    receiver = WeightReceiver(group, reuse_buffers=True) if rank == 1 else None  # as PullWeights does
    for i in range(reps + 1):  # the first round warms NCCL up and is not counted
        sync()
        group.broadcast(torch.zeros(1, device=device))  # line both ranks up
        t0 = time.perf_counter()
        group.broadcast(flat)
        sync()
        t_raw = time.perf_counter() - t0
        group.broadcast(torch.zeros(1, device=device))
        t0 = time.perf_counter()
        if rank == 0:
            sender.push(weights, version=i)
        else:
            received = receiver.receive(expected_version=i)
            apply_to_module(model, received.tensors)
            del received
        sync()
        t_ours = time.perf_counter() - t0
        if i:
            raw.append(t_raw)
            ours.append(t_ours)
    if rank == 1:
        result_q.put({"shape": shape, "tensors": len(weights), "bytes": nbytes,
                      "raw_s": statistics.median(raw),
                      "rlfleet_s": statistics.median(ours),
                      "raw_min_s": min(raw), "rlfleet_min_s": min(ours)})
    group.close()


def one_gpu_worker(rank: int, shape: str, address_q, result_q, reps: int) -> None:
    """Both ranks on GPU 0: CUDA IPC against gloo through host memory, push -> applied."""
    from rlfleet.weights import WeightGroup, WeightReceiver, WeightSender, apply_to_module
    from rlfleet.weights.ipc import IpcWeightReceiver, IpcWeightSender
    from rlfleet.weights.naming import model_weights

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    model = build(shape, device)
    weights = model_weights(model)
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    group = (WeightGroup.host(2, backend="gloo", timeout_s=120, device="cpu") if rank == 0
             else WeightGroup.join(address_q.get(), 1, 2, backend="gloo", timeout_s=120, device="cpu"))
    if rank == 0:
        address_q.put(group.address)
    group.connect()
    times: dict[str, list[float]] = {"ipc": [], "gloo": [], "d2d": []}
    ends = {"ipc": (IpcWeightSender(group, device), None) if rank == 0
            else (None, IpcWeightReceiver(group, device)),
            "gloo": (WeightSender(group, checksums=True), None) if rank == 0
            else (None, WeightReceiver(group, reuse_buffers=True))}
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    copy = torch.empty_like(flat)
    for i in range(reps + 1):  # the first round maps buffers, warms up, and is not counted
        for name, (sender, receiver) in ends.items():
            torch.cuda.synchronize()
            group.broadcast(torch.zeros(1))  # line both ranks up
            t0 = time.perf_counter()
            if rank == 0:
                sender.push(weights, version=i)
            else:
                apply_to_module(model, receiver.receive(expected_version=i).tensors)
            torch.cuda.synchronize()
            if i:
                times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        copy.copy_(flat)
        torch.cuda.synchronize()
        if i:
            times["d2d"].append(time.perf_counter() - t0)
    if rank == 1:
        result_q.put({"shape": shape, "tensors": len(weights), "bytes": nbytes,
                      **{f"{k}_s": statistics.median(v) for k, v in times.items()}})
    group.close()


def _result(result_q, procs) -> dict:
    """The rollout rank's row; fails at once when a rank died instead of waiting out a timeout."""
    import queue

    while True:
        try:
            row = result_q.get(timeout=2)
            break
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}") from None
    for p in procs:
        p.join()
    return row


def one_gpu(shapes: list[str], reps: int, out: str | None) -> None:
    ctx = mp.get_context("spawn")
    rows = []
    for shape in shapes:
        address_q, result_q = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=one_gpu_worker, args=(r, shape, address_q, result_q, reps))
                 for r in (0, 1)]
        for p in procs:
            p.start()
        row = _result(result_q, procs)
        row["gloo_over_ipc"] = row["gloo_s"] / row["ipc_s"]
        rows.append(row)
        print(f"weight sync {shape} on one GPU ({row['tensors']} tensors, {row['bytes'] / 1e9:.3f} GB): "
              f"CUDA IPC push->applied {row['ipc_s'] * 1e3:.1f} ms | gloo via host "
              f"{row['gloo_s'] * 1e3:.1f} ms | one D2D copy {row['d2d_s'] * 1e3:.2f} ms | "
              f"gloo/IPC {row['gloo_over_ipc']:.1f}x", flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "mode": "onegpu",
                       "rows": rows}, f, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="0.5b,1.5b,7b")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", choices=("cuda", "cpu", "onegpu"), default="cuda")
    parser.add_argument("--scale", type=int, default=1, help="divide hidden/intermediate/vocab by this")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.device == "onegpu":
        return one_gpu(args.shapes.split(","), args.reps, args.out)
    ctx = mp.get_context("spawn")
    rows = []
    for shape in args.shapes.split(","):
        address_q, result_q = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=worker, args=(r, shape, address_q, result_q, args.reps,
                                                  args.device == "cpu",
                                                  args.scale)) for r in (0, 1)]
        for p in procs:
            p.start()
        row = result_q.get(timeout=900)
        for p in procs:
            p.join()
        row["ratio"] = row["rlfleet_s"] / row["raw_s"]
        row["raw_GBps"] = row["bytes"] / row["raw_s"] / 1e9
        rows.append(row)
        transport = "gloo" if args.device == "cpu" else "NCCL"
        print(f"weight sync {shape}/{args.scale} ({row['tensors']} tensors, {args.device}): "
              f"{row['bytes'] / 1e9:.3f} GB | raw {transport} {row['raw_s'] * 1e3:.1f} ms "
              f"({row['raw_GBps']:.0f} GB/s) | rlfleet push->applied {row['rlfleet_s'] * 1e3:.1f} ms "
              f"| ratio {row['ratio']:.2f}x | best raw {row['raw_min_s'] * 1e3:.1f} ms, "
              f"rlfleet {row['rlfleet_min_s'] * 1e3:.1f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpus": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                       "torch": torch.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main()
