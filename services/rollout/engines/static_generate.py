"""Batched generation with rlfleet's static-cache decode loop (CUDA-graph replayed on GPU).

Gives what `generate(..., output_logits=True)` gave the HF engine: for each row the new
tokens (pad after its eos) and each token's logprob, with generation ending when every
row has produced an eos or `max_new_tokens` tokens.
"""
from __future__ import annotations

import torch

from rlfleet.types import SamplingParams
from services.rollout.engines.decoder import CompiledRegion, KVCache, StaticDecoder
from services.rollout.engines.graphs import (
    CPU_LENGTH_ALIGN,
    LENGTH_ALIGN,
    DecodeSlot,
    SlotCache,
    batch_bucket,
)
from services.rollout.engines.sampling import TokenSampler, scaled_choose

FINISH_CHECK_EVERY = 8  # steps between the host's looks at "how many rows still generate?" (each one syncs)
#: rows below which compaction stops: a step this small costs its kernel launches, not its rows, and
#: batch 1 would make the compiled regions specialise (one more compilation)
MIN_COMPACT_BATCH = 8
PREFILL_TOKENS = 16384  # prompt tokens prefilled together


def left_padded(rows: list[list[int]], width: int,
                pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, valid and rotary positions [len(rows), width] on the CPU: each row's last prompt token
    in the last column, positions 0.. over its own tokens (1 on padding, as transformers sets them)."""
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    positions = torch.ones((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        valid[i, width - len(row):] = True
        positions[i, width - len(row):] = torch.arange(len(row))
    return ids, valid, positions


class StaticGenerator:
    """With `compact` (the default), finished rows stop costing decode steps: every
    FINISH_CHECK_EVERY steps, once the unfinished rows fit a smaller batch bucket, they move (cache,
    valid columns, lengths) to the first rows of the slot and the loop goes on with the slot narrowed
    to that bucket. GRPO's short answers that end at EOS leave most of a batch finished long before
    its longest row is; without compaction every step still computed all of them."""

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_ids: list[int], cuda_graphs: bool,
                 compile_decode: bool = False, compact: bool = True, fuse: bool = True,
                 attention: str = "auto"):
        self.device = next(model.parameters()).device
        on_gpu = self.device.type == "cuda"
        self.decoder = StaticDecoder(model, compile_layers=compile_decode and on_gpu, fuse=fuse,
                                     attention=attention)
        self.pad_id, self.eos_ids, self.compact = pad_id, eos_ids, compact
        # the sampler's common step as one compiled region where the decode step is compiled (sampling.py)
        self.fused_sampler = CompiledRegion(scaled_choose) if compile_decode and on_gpu else None
        self.slots = SlotCache(self.decoder, capture=cuda_graphs and on_gpu,
                               length_align=LENGTH_ALIGN if on_gpu else CPU_LENGTH_ALIGN)

    @torch.no_grad()
    def generate(self, rows: list[list[int]], params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """New tokens [len(rows), T] and their logprobs [len(rows), T] (on the CPU), T <= max_new_tokens."""
        width, new = max(len(r) for r in rows), params.max_new_tokens
        slot = self.slots.get(len(rows), width + new)
        batch = slot.batch
        # bucket padding rows: one pad token each
        ids, valid, positions = left_padded(rows + [[self.pad_id]] * (batch - len(rows)), width, self.pad_id)
        ids, valid, positions = ids.to(self.device), valid.to(self.device), positions.to(self.device)
        lengths = valid.sum(dim=1)
        slot.valid.zero_()
        slot.valid[:, :width] = valid
        sampler = TokenSampler(params, self.eos_ids, self.device, fused=self.fused_sampler)
        eos = sampler.eos
        tokens = torch.full((batch, new), self.pad_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((batch, new), dtype=torch.float32, device=self.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        finished[len(rows):] = True  # bucket padding rows never hold generation up
        logits = self._prefill_distinct(slot.cache, ids, positions, slot.valid, rows)
        steps, active = new, slot
        row_of = torch.arange(batch, device=self.device)  # the row of `tokens` each row of `active` decodes
        last = tokens[:, 0]  # the previous step's tokens, fed to the next step
        for t in range(new):
            if t:
                active.ids.copy_(last)
                torch.add(lengths, t - 1, out=active.positions)
                active.column.fill_(width + t - 1)
                logits = active.step()
            token, logprob = sampler(logits, first=t == 0)
            last = torch.where(finished, self.pad_id, token)  # a finished row emits padding
            tokens[row_of, t] = last
            logprobs[row_of, t] = torch.where(finished, 0.0, logprob)
            finished |= torch.isin(token, eos)
            if (t + 1) % FINISH_CHECK_EVERY == 0:
                remaining = int(finished.numel() - finished.sum())  # the loop's one host sync
                if not remaining:
                    steps = t + 1
                    break
                narrower = max(batch_bucket(remaining), MIN_COMPACT_BATCH)
                if self.compact and narrower < active.batch:
                    order = _unfinished_first(finished)[:narrower]
                    active = _compact(slot, active, order, columns=width + t)
                    lengths, finished = lengths[order], finished[order]
                    row_of, last = row_of[order], last[order]
        return tokens[:len(rows), :steps].cpu(), logprobs[:len(rows), :steps].cpu()

    def _prefill_distinct(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
                          valid: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
        """Prefills each distinct prompt once (a GRPO group's n rows share one) into the first cache
        rows, then copies every row's prompt keys/values from its prompt's; returns logits [batch, V]."""
        keys = [tuple(r) for r in rows] + [(self.pad_id,)] * (ids.shape[0] - len(rows))  # + bucket padding
        first_row: dict[tuple[int, ...], int] = {}
        for i, key in enumerate(keys):
            first_row.setdefault(key, i)
        if len(first_row) == len(keys):
            return self._prefill(cache, ids, positions, valid)
        slot_of = {key: k for k, key in enumerate(first_row)}
        distinct = torch.tensor(list(first_row.values()), device=self.device)
        count = len(first_row)
        first_rows = KVCache(cache.keys[:, :count], cache.values[:, :count])  # views: writes land in `cache`
        logits = self._prefill(first_rows,
                               ids[distinct], positions[distinct], valid[distinct])
        index, width = torch.tensor([slot_of[key] for key in keys], device=self.device), ids.shape[1]
        for layer in range(cache.keys.shape[0]):  # one layer at a time: the copy's buffer stays small
            cache.keys[layer, :, :, :width] = cache.keys[layer, index, :, :width]
            cache.values[layer, :, :, :width] = cache.values[layer, index, :, :width]
        return logits[index]

    def _prefill(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
                 valid: torch.Tensor) -> torch.Tensor:
        """Prefills a block of rows at a time, so the attention's [rows, W, W] mask and the
        activations stay bounded (PREFILL_TOKENS) however many rows and prompt tokens come."""
        rows = max(1, PREFILL_TOKENS // ids.shape[1])
        logits = []
        for r in range(0, ids.shape[0], rows):
            block = KVCache(cache.keys[:, r:r + rows],
                            cache.values[:, r:r + rows])  # views: writes land in `cache`
            logits.append(self.decoder.prefill(block, ids[r:r + rows], positions[r:r + rows],
                                               valid[r:r + rows]))
        return torch.cat(logits)


def _unfinished_first(finished: torch.Tensor) -> torch.Tensor:
    """Row indices, the unfinished rows first (in order), then the finished ones."""
    return torch.cat([torch.nonzero(~finished)[:, 0], torch.nonzero(finished)[:, 0]])


def _compact(slot: DecodeSlot, active: DecodeSlot, order: torch.Tensor, columns: int) -> DecodeSlot:
    """Moves `active`'s rows `order` (their first `columns` cache columns and their valid columns)
    to the first rows of `slot`, and returns `slot` narrowed to len(order) rows. Indexing by
    `order` copies before the write, so the overlapping source and target are safe."""
    target = slot.narrowed(len(order))
    for layer in range(slot.cache.keys.shape[0]):  # one layer at a time: the copy's buffer stays small
        target.cache.keys[layer, :, :, :columns] = active.cache.keys[layer, order, :, :columns]
        target.cache.values[layer, :, :, :columns] = active.cache.values[layer, order, :, :columns]
    target.valid.copy_(active.valid[order])
    return target
