"""Batched generation with rlfleet's static-cache decode loop (CUDA-graph replayed on GPU).

Gives what `generate(..., output_logits=True)` gave the HF engine: for each row the new
tokens (pad after its eos) and each token's logprob, with generation ending when every
row has produced an eos or `max_new_tokens` tokens.
"""
from __future__ import annotations

import torch

from rlfleet.types import SamplingParams
from services.rollout.engines.decoder import KVCache, StaticDecoder
from services.rollout.engines.graphs import SlotCache
from services.rollout.engines.sampling import TokenSampler

FINISH_CHECK_EVERY = 8  # steps between the host's looks at "has every row finished?" (each one syncs)
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
    def __init__(self, model: torch.nn.Module, pad_id: int, eos_ids: list[int], cuda_graphs: bool,
                 compile_decode: bool = False):
        self.device = next(model.parameters()).device
        on_gpu = self.device.type == "cuda"
        self.decoder = StaticDecoder(model, compile_layers=compile_decode and on_gpu)
        self.pad_id, self.eos_ids = pad_id, eos_ids
        self.slots = SlotCache(self.decoder, capture=cuda_graphs and on_gpu)

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
        sampler = TokenSampler(params, self.eos_ids, self.device)
        eos = sampler.eos
        tokens = torch.full((batch, new), self.pad_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((batch, new), dtype=torch.float32, device=self.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        finished[len(rows):] = True  # bucket padding rows never hold generation up
        logits = self._prefill_distinct(slot.cache, ids, positions, slot.valid, rows)
        steps = new
        for t in range(new):
            if t:
                slot.ids.copy_(tokens[:, t - 1])
                torch.add(lengths, t - 1, out=slot.positions)
                slot.column.fill_(width + t - 1)
                logits = slot.step()
            token, logprob = sampler(logits, first=t == 0)
            tokens[:, t] = torch.where(finished, self.pad_id, token)  # a finished row emits padding
            logprobs[:, t] = torch.where(finished, 0.0, logprob)
            finished |= torch.isin(token, eos)
            if (t + 1) % FINISH_CHECK_EVERY == 0 and bool(finished.all()):
                steps = t + 1
                break
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
