"""Device and dtype choice, shared by every service."""
from __future__ import annotations

import sys
import threading

import torch

from rlfleet.errors import ConfigError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: Held by a CUDA graph capture, and by work on other threads that no capture may overlap: a device-wide
#: synchronize, or mapping another process's CUDA IPC buffers. CUDA refuses such calls while any stream
#: of the process captures, whatever the capture mode, and the refusal also invalidates the capture: at
#: max_staleness=1 a weight pull landing on a decode-slot capture failed the pull
#: (cudaErrorStreamCaptureUnsupported) and then the next generation (cudaErrorStreamCaptureInvalidated).
CUDA_CAPTURE_EXCLUSIVE = threading.Lock()


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


def runs_on_cpu(spec: str) -> bool:
    """Whether a role whose device setting is `spec` computes on the CPU, as resolve_device places it."""
    if spec == "auto":
        return not torch.cuda.is_available()
    return spec.split(":")[0] == "cpu"


def keep_triton_out(device: torch.device) -> bool:
    """Make Triton unimportable in a process whose tensors all live on `device`, if that is the CPU;
    call it before transformers' models are imported. Returns whether it did.

    Why: transformers imports torch._dynamo, which imports Triton whenever the package is installed
    (it is with torch's CUDA build, or beside vLLM): ~70 MB of resident memory per process for a
    compiler of GPU kernels that a CPU process never runs (torch.compile's CPU backend emits C++).
    `sys.modules["triton"] = None` is how Python says "not installed": torch's and transformers'
    imports of Triton are guarded by `except ImportError`, exactly as on a CPU-only install.
    Nothing changes on a GPU, or where Triton is already loaded."""
    if device.type != "cpu" or "triton" in sys.modules:
        return False
    sys.modules["triton"] = None
    return True


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[spec]


def placement(device: torch.device, ipc_capable: bool) -> str:
    """Where a weight-group member's weights live, for the learner's choice of transport:
    `HOST/GPU-UUID[/ipc]` or `HOST/cpu`. HOST is the machine's boot id (containers of one host
    share it), the UUID names the physical GPU whatever CUDA_VISIBLE_DEVICES says."""
    where = str(torch.cuda.get_device_properties(device).uuid) if device.type == "cuda" else "cpu"
    return f"{_host_id()}/{where}" + ("/ipc" if ipc_capable and device.type == "cuda" else "")


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        import socket

        return socket.gethostname()


def weight_backend(spec: str, device: torch.device, members: list[str] | None = None) -> str:
    """The transport of the weight group. `auto` follows placement (`members`: each rollout
    member's placement()): CUDA IPC when every member sits on the learner's own GPU and can
    map it, NCCL when the learner and every member have GPUs (NCCL cannot put two ranks on
    one GPU), else gloo through host memory. Without placements (an older controller), NCCL
    when the host has several GPUs, else gloo."""
    if spec != "auto":
        if spec in ("nccl", "ipc") and device.type != "cuda":
            raise ConfigError(f"learner.weight_backend = {spec!r} needs the learner on a GPU, not {device}")
        return spec
    if device.type != "cuda":
        return "gloo"
    return backend_for_placement(placement(device, ipc_capable=True), members, torch.cuda.device_count())


def backend_for_placement(learner: str, members: list[str] | None, gpus_on_host: int) -> str:
    """weight_backend()'s rule for a learner on a GPU (`learner` is its placement())."""
    if not members:
        return "nccl" if gpus_on_host > 1 else "gloo"
    if all(m == learner for m in members):
        return "ipc"
    on_gpus = all(len(m.split("/")) > 1 and m.split("/")[1] != "cpu" for m in members)
    shares_gpu = any(m.split("/")[:2] == learner.split("/")[:2] for m in members)
    return "nccl" if on_gpus and not shares_gpu else "gloo"


def weight_checksums(spec: str, backend: str) -> bool:
    """`auto`: per-bucket checksums over gloo only. NCCL moves buckets between GPUs over links
    with their own integrity checks, CUDA IPC copies within one GPU's memory, and on the GPU the
    checksum passes cost several times the wire time (bench/weight_sync.py)."""
    return spec == "on" or (spec == "auto" and backend == "gloo")


def transfer_device(backend: str, device: torch.device) -> torch.device:
    """Where the weight group's tensors live: the GPU for NCCL, host memory for gloo and for
    the IPC handoff's control messages (its buckets stay on the GPU, rlfleet.weights.ipc)."""
    return device if backend == "nccl" else torch.device("cpu")
