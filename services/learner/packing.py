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

import numpy as np
import torch

from rlfleet.types import TrainSample
from services.learner.flatten import flat


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


def pack(samples: list[TrainSample], pad_id: int, device: torch.device, tokens: np.ndarray | None = None,
         lengths: np.ndarray | None = None) -> PackedLayout:
    """`tokens` / `lengths`: the samples' prompt+response tokens concatenated and their lengths, when
    the caller has them already (batching.collate). Placed by whole-array indexing, no per-sample loop."""
    if lengths is None:
        lengths = np.array([_length(s) for s in samples], dtype=np.int64)
    if tokens is None:
        tokens = flat((seq for s in samples for seq in (s.prompt_ids, s.response_ids)), np.int64)
    rows = assign_rows([int(n) for n in lengths])
    R, C = len(rows), int(lengths.max())
    row_of = np.empty(len(samples), dtype=np.int64)
    start_of = np.empty(len(samples), dtype=np.int64)
    used = np.zeros(R, dtype=np.int64)
    for r, members in enumerate(rows):
        for i in members:
            row_of[i], start_of[i] = r, used[r]
            used[r] += lengths[i]
    offset_in_sample = np.arange(tokens.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    token_row = np.repeat(row_of, lengths)
    token_col = np.repeat(start_of, lengths) + offset_in_sample
    input_ids = np.full((R, C), pad_id, dtype=np.int64)
    input_ids[token_row, token_col] = tokens
    # The row's padding is a separate block (positions restart at 0), so it attends to itself only.
    positions = np.arange(C)[None, :] - used[:, None]
    positions = np.where(positions >= 0, positions, np.arange(C)[None, :]).astype(np.int64)
    positions[token_row, token_col] = offset_in_sample
    # Padded position t of sample i predicts token t + 1 from packed column start + t.
    index = np.zeros((len(samples), C - 1), dtype=np.int64)
    predicting = offset_in_sample < np.repeat(lengths - 1, lengths)  # every token but a sample's last
    sample_of = np.repeat(np.arange(len(samples)), lengths)
    index[sample_of[predicting], offset_in_sample[predicting]] = (token_row * (C - 1) + token_col)[predicting]
    return PackedLayout(torch.from_numpy(input_ids).to(device), torch.from_numpy(positions).to(device),
                        torch.from_numpy(index).to(device))
