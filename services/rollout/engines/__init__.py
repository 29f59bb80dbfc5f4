"""Rollout engines by `rollout.backend`: one registration each, so `rlfleet serve rollout` has no
`if backend == ...` chain. A new engine implements services.rollout.engine.RolloutEngine in its own
module and registers a factory here (and its name in rlfleet.config.RolloutConfig.backend)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlfleet.registry import Registry

# (model folder, torch device, torch dtype, the `rollout` config section, run seed) -> a RolloutEngine
EngineFactory = Callable[[Path, Any, Any, Any, int], Any]
ENGINES: Registry[EngineFactory] = Registry("rollout engine")


@ENGINES.register("hf")
def hf_engine(path, device, dtype, cfg, seed: int):
    """transformers, with rlfleet's static-KV-cache decode loop (services/rollout/engines/hf.py)."""
    from services.rollout.engines.hf import HFEngine
    return HFEngine(path, device, dtype, cfg.max_batch_sequences, cfg.hf_decode, cfg.cuda_graphs)


@ENGINES.register("vllm")
def vllm_engine(path, device, dtype, cfg, seed: int):
    """vLLM's asynchronous engine (services/rollout/engines/vllm.py); imports vllm only when chosen."""
    from services.rollout.engines.vllm import VLLMEngine
    return VLLMEngine(path, device, dtype, cfg, seed=seed)
