"""Sequence packing: several samples share one model row, with no attention between them.

Each sample keeps its own position ids (restarting at 0), and the model is called with
``attention_mask=None``: transformers' masking_utils (``find_packed_sequence_indices``) then
reads every restart of the position ids as a sequence boundary and builds a block-diagonal
causal mask, so every sample sees exactly what it would see alone in a padded row.

The loss code is unchanged: a packed micro-batch still carries its padded ``*_B_T`` tensors
(small), and ``index_B_T`` maps every padded position to the packed position whose hidden
state predicts the same target.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlfleet.types import TrainSample


@dataclass
class PackedLayout:
    input_ids_R_C: torch.Tensor  # R rows of C tokens; the tail of a row is padding
    position_ids_R_C: torch.Tensor  # restart at 0 for every sample (and for a row's padding)
    index_B_T: torch.Tensor  # flat index into the R x (C - 1) prediction grid; 0 where nothing is predicted


def _length(s: TrainSample) -> int:
    return len(s.prompt_ids) + len(s.response_ids)


def split_by_packed_budget(samples: list[TrainSample], budget_tokens: int) -> list[list[TrainSample]]:
    """Greedy in order: a micro-batch's real tokens (no padding) stay within the budget;
    a single sample longer than the budget gets a micro-batch of its own."""
    batches: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    used = 0
    for s in samples:
        length = _length(s)
        if current and used + length > budget_tokens:
            batches.append(current)
            current, used = [], 0
        current.append(s)
        used += length
    if current:
        batches.append(current)
    return batches


def assign_rows(lengths: list[int]) -> list[list[int]]:
    """First-fit decreasing into rows as long as the longest sample: rows never grow past a
    sample's own padded length, so attention cost per row stays that of the padded layout."""
    capacity = max(lengths)
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(capacity - lengths[i])
    return rows


def pack(samples: list[TrainSample], pad_id: int, device: torch.device) -> PackedLayout:
    lengths = [_length(s) for s in samples]
    rows = assign_rows(lengths)
    R, C = len(rows), max(lengths)
    input_ids = torch.full((R, C), pad_id, dtype=torch.long)
    positions = torch.zeros((R, C), dtype=torch.long)
    index = torch.zeros((len(samples), C - 1), dtype=torch.long)
    for r, members in enumerate(rows):
        start = 0
        for i in members:
            s, n = samples[i], lengths[i]
            input_ids[r, start:start + n] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
            positions[r, start:start + n] = torch.arange(n)
            # Padded position t of sample i predicts token t + 1 from packed column start + t.
            index[i, :n - 1] = r * (C - 1) + start + torch.arange(n - 1)
            start += n
        # The row's padding is a separate block (positions restart at 0), so it attends to itself only.
        positions[r, start:] = torch.arange(C - start)
    return PackedLayout(input_ids.to(device), positions.to(device), index.to(device))
