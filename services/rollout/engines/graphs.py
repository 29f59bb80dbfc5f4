"""Decode-step slots: a KV cache with the step's static inputs, replayed as a CUDA graph on GPU.

A slot is keyed by (batch bucket, cache length bucket), so chunks of similar size reuse one
capture; a few slots are kept (least recently used goes first) because each holds a cache.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from services.rollout.engines.decoder import KVCache, StaticDecoder

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LENGTH_ALIGN = 64  # cache length rounded up to this, so prompt widths that differ a little share a slot


def batch_bucket(rows: int) -> int:
    return next((b for b in BATCH_BUCKETS if b >= rows), rows)


def length_bucket(tokens: int) -> int:
    return -(-tokens // LENGTH_ALIGN) * LENGTH_ALIGN


class DecodeSlot:
    """Static inputs of one decode step (ids, positions, column, valid) and its cache.

    `step()` returns the logits [B, V]; with a CUDA graph they live in the graph's output
    buffer and are overwritten by the next replay."""

    def __init__(self, decoder: StaticDecoder, batch: int, length: int, capture: bool, pool=None):
        self.decoder = decoder
        self.cache = KVCache.allocate(decoder.model, batch, length)
        device = self.cache.keys.device
        self.ids = torch.zeros(batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, length, dtype=torch.bool, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        if capture:
            self._capture(pool)

    @property
    def batch(self) -> int:
        return self.cache.batch

    def _eager(self) -> torch.Tensor:
        return self.decoder.step(self.cache, self.ids, self.positions, self.column, self.valid)

    def _capture(self, pool) -> None:
        # Warm-up runs on a side stream first: cuBLAS handles and workspaces are created
        # outside the capture, as CUDA graphs require.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._eager()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the weight-sync thread may receive a broadcast while this thread captures.
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self._logits = self._eager()

    def step(self) -> torch.Tensor:
        if self.graph is None:
            return self._eager()
        self.graph.replay()
        return self._logits


class SlotCache:
    """The most recently used DecodeSlots, created (and captured) on first use."""

    def __init__(self, decoder: StaticDecoder, capture: bool, keep: int = 2):
        self.decoder, self.capture, self.keep = decoder, capture, keep
        self._slots: OrderedDict[tuple[int, int], DecodeSlot] = OrderedDict()
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def get(self, rows: int, tokens: int) -> DecodeSlot:
        key = (batch_bucket(rows), length_bucket(tokens))
        slot = self._slots.pop(key, None)
        if slot is None:
            while len(self._slots) >= self.keep:
                self._slots.popitem(last=False)
            slot = DecodeSlot(self.decoder, *key, capture=self.capture, pool=self._pool)
        self._slots[key] = slot
        return slot
