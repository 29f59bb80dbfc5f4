"""Device and dtype choice, shared by every service."""
from __future__ import annotations

import torch

from rlfleet.errors import ConfigError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(spec: str, prefer_index: int = 0) -> torch.device:
    """`auto` takes CUDA device `prefer_index` (mod the count) when there is one, else the CPU."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", prefer_index % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ConfigError(f"device {spec!r} is not a torch device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {spec!r} asked for CUDA but no GPU is visible")
    return device


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[spec]


def weight_backend(spec: str, device: torch.device) -> str:
    """`auto`: NCCL when the learner is on a GPU and the host has several (NCCL cannot put two
    ranks on one GPU, which is what a one-GPU host shared by learner and rollout would need)."""
    if spec != "auto":
        if spec == "nccl" and device.type != "cuda":
            raise ConfigError(f"learner.weight_backend = 'nccl' needs the learner on a GPU, not {device}")
        return spec
    return "nccl" if device.type == "cuda" and torch.cuda.device_count() > 1 else "gloo"


def weight_checksums(spec: str, backend: str) -> bool:
    """`auto`: per-bucket checksums over gloo only. NCCL moves buckets between GPUs over links
    with their own integrity checks, and on the GPU the checksum passes cost several times the
    wire time (bench/weight_sync.py)."""
    return spec == "on" or (spec == "auto" and backend == "gloo")


def transfer_device(backend: str, device: torch.device) -> torch.device:
    """Where weight buckets live during a transfer: the GPU for NCCL, host memory for gloo."""
    return device if backend == "nccl" else torch.device("cpu")
