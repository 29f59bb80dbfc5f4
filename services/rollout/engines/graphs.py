"""Decode-step slots: a KV cache with the step's static inputs, replayed as a CUDA graph on GPU.

A slot is keyed by (batch bucket, cache length bucket), so chunks of similar size reuse one
capture; a few slots are kept (least recently used goes first) because each holds a cache. A
slot's narrowed slots (its first rows, for the rows still generating) share its cache.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from rlfleet.devices import CUDA_CAPTURE_EXCLUSIVE
from services.rollout.engines.decoder import KVCache, StaticDecoder

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LENGTH_ALIGN = 64  # cache length rounded up to this, so prompt widths that differ a little share a slot
#: the same on the CPU, where no graph is captured: a cache is kept for reuse all the same, but every
#: decode step's attention reads all its columns and it is host memory: the small job's 16-18-token
#: prompts + 8 new tokens fill 32 columns, not 64 (256 rows: 17 MB of keys and values, not 34)
CPU_LENGTH_ALIGN = 16


def batch_bucket(rows: int) -> int:
    return next((b for b in BATCH_BUCKETS if b >= rows), rows)


def length_bucket(tokens: int, align: int = LENGTH_ALIGN) -> int:
    return -(-tokens // align) * align


class DecodeSlot:
    """Static inputs of one decode step (ids, positions, column, valid) and its cache.

    `step()` returns the logits [B, V]; with a CUDA graph they live in the graph's output
    buffer and are overwritten by the next replay.

    `narrowed(b)` is the slot's first b rows as a slot of their own (views of the same cache and
    inputs, a graph of its own), so generation can move its unfinished rows there and stop paying
    for the finished ones."""

    def __init__(self, decoder: StaticDecoder, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
                 column: torch.Tensor, valid: torch.Tensor, capture: bool, pool=None):
        self.decoder, self.cache = decoder, cache
        self.ids, self.positions, self.column, self.valid = ids, positions, column, valid
        self.graph: torch.cuda.CUDAGraph | None = None
        self._capture_at_first_step, self._pool = capture, pool
        self._narrowed: dict[int, DecodeSlot] = {}

    @classmethod
    def allocate(cls, decoder: StaticDecoder, batch: int, length: int, capture: bool,
                 pool=None) -> DecodeSlot:
        cache = KVCache.allocate(decoder.model, batch, length)
        device = cache.keys.device

        def longs(size: int) -> torch.Tensor:
            return torch.zeros(size, dtype=torch.long, device=device)

        slot = cls(decoder, cache, longs(batch), longs(batch), longs(1),
                   torch.zeros(batch, length, dtype=torch.bool, device=device), capture=False, pool=pool)
        if capture:  # now, before any prefill: the capture's warm-up writes land in an unused cache
            slot._capture()
        return slot

    @property
    def batch(self) -> int:
        return self.cache.batch

    def narrowed(self, batch: int) -> DecodeSlot:
        """This slot's first `batch` rows: their cache, ids, positions and valid columns are views of
        this slot's, the column is shared. Its graph is captured at its first step, whose inputs are
        then set for real: the capture's warm-up runs are that very step (it only writes its own
        column, so running it again gives the same cache)."""
        if batch == self.batch:
            return self
        if batch not in self._narrowed:
            cache = KVCache(self.cache.keys[:, :batch], self.cache.values[:, :batch])
            self._narrowed[batch] = DecodeSlot(self.decoder, cache, self.ids[:batch], self.positions[:batch],
                                               self.column, self.valid[:batch],
                                               capture=self.graph is not None, pool=self._pool)
        return self._narrowed[batch]

    def _eager(self) -> torch.Tensor:
        return self.decoder.step(self.cache, self.ids, self.positions, self.column, self.valid)

    def _capture(self) -> None:
        # Warm-up runs on a side stream first: cuBLAS handles and workspaces are created
        # outside the capture, as CUDA graphs require.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._eager()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the weight-sync thread may receive a broadcast while this thread captures; its
        # device-wide calls (the IPC copy's synchronize) wait for the capture to end instead.
        with CUDA_CAPTURE_EXCLUSIVE, torch.cuda.graph(graph, pool=self._pool,
                                                      capture_error_mode="thread_local"):
            self._logits = self._eager()
        self.graph = graph

    def step(self) -> torch.Tensor:
        if self._capture_at_first_step:
            self._capture_at_first_step = False
            self._capture()
        if self.graph is None:
            return self._eager()
        self.graph.replay()
        return self._logits


class SlotCache:
    """The most recently used DecodeSlots, created (and captured) on first use."""

    def __init__(self, decoder: StaticDecoder, capture: bool, keep: int = 2,
                 length_align: int = LENGTH_ALIGN):
        self.decoder, self.capture, self.keep, self.length_align = decoder, capture, keep, length_align
        self._slots: OrderedDict[tuple[int, int], DecodeSlot] = OrderedDict()
        self._pool = torch.cuda.graph_pool_handle() if capture else None

    def get(self, rows: int, tokens: int) -> DecodeSlot:
        key = (batch_bucket(rows), length_bucket(tokens, self.length_align))
        slot = self._slots.pop(key, None)
        if slot is None:
            while len(self._slots) >= self.keep:
                self._slots.popitem(last=False)
            slot = DecodeSlot.allocate(self.decoder, *key, capture=self.capture, pool=self._pool)
        self._slots[key] = slot
        return slot
