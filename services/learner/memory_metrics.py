"""The learner's GPU memory over one train step, as metrics.

verl reports each step's peak allocated and reserved memory; rlfleet does too, and adds the caching
allocator's retries during the step: a retry is a cudaMalloc that failed, after which the allocator
frees every cached block and synchronises the device before trying again. A learner that shares its
GPU with a rollout under a memory cap (learner.gpu_memory_utilization) and retries every step spends
its time there, not in its kernels. On a CPU learner there is nothing to report, and nothing is.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

GiB = 2**30


@dataclass
class StepMemory:
    read_stats: Callable[[], dict]
    retries_before: int

    @classmethod
    def start(cls, device: torch.device, read_stats: Callable[[], dict] | None = None,
              reset_peaks: Callable[[], None] | None = None) -> StepMemory | None:
        """None off a GPU; otherwise the peaks are reset and the retries so far noted."""
        if device.type != "cuda":
            return None
        read_stats = read_stats or (lambda: torch.cuda.memory_stats(device))
        (reset_peaks or (lambda: torch.cuda.reset_peak_memory_stats(device)))()
        return cls(read_stats, read_stats().get("num_alloc_retries", 0))

    def finish(self) -> dict[str, float]:
        stats = self.read_stats()
        return {"perf/learner_max_memory_allocated_gb": stats.get("allocated_bytes.all.peak", 0) / GiB,
                "perf/learner_max_memory_reserved_gb": stats.get("reserved_bytes.all.peak", 0) / GiB,
                "perf/learner_alloc_retries": stats.get("num_alloc_retries", 0) - self.retries_before}
