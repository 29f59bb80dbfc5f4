"""Runs inside vLLM's worker processes (`worker_extension_cls`): joins the learner's weight
group and loads each received version into the worker's model.

vLLM calls these methods through `collective_rpc`, on every tensor-parallel worker;
each worker takes its own rank in the weight group (base rank + its TP rank), receives
the full weights and lets the model's `load_weights` shard and fuse them.
"""
from __future__ import annotations

import torch

from rlfleet.devices import transfer_device
from rlfleet.weights import WeightGroup, WeightReceiver
from rlfleet.weights.digest import weights_digest


class RlfleetWeightExtension:
    """Mixed into vLLM's Worker class, so `self.model_runner`, `self.rank` and `self.device` exist."""

    def rlfleet_join(self, address: str, base_rank: int, world_size: int, backend: str, timeout_s: float,
                     token: str | None = None) -> int:
        old = getattr(self, "_rlfleet_group", None)
        if old is not None:
            old.close()
        device = torch.device(getattr(self, "device", "cpu"))
        rank = base_rank + int(getattr(self, "rank", 0))
        self._rlfleet_group = WeightGroup.join(address, rank=rank, world_size=world_size, backend=backend,
                                               timeout_s=timeout_s, device=transfer_device(backend, device),
                                               token=token)
        self._rlfleet_receiver = WeightReceiver(self._rlfleet_group)
        return rank

    def rlfleet_pull(self, version: int) -> int:
        """Receives `version` and loads it; returns the bytes received."""
        group = self._rlfleet_group
        try:
            group.connect()
            received = self._rlfleet_receiver.receive(expected_version=version)
        except Exception:
            group.close()
            self._rlfleet_group = None
            raise
        # Checkpoint-format weights go through vLLM's layerwise reload, which re-runs the
        # post-load processing (fusing, repacking for the CPU kernels) that load_weights alone skips.
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        model = self.model_runner.model
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
            model.load_weights(weights=list(received.tensors.items()))
            finalize_layerwise_reload(model, self.vllm_config.model_config)
            _refresh_cpu_embedding_gemm(model)
        return int(received.nbytes)

    def rlfleet_digest(self) -> str:
        return weights_digest(self.model_runner.model.named_parameters())


def _refresh_cpu_embedding_gemm(model: torch.nn.Module) -> None:
    """On the CPU, vLLM keeps a prepacked copy of the (tied) embedding for the LM head's GEMM,
    which its layerwise reload leaves stale (measured: logprobs off by ~0.6 after an
    embedding-only update); repack it from the reloaded weight."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for module in model.modules():
        if isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
