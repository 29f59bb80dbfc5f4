"""Turns TrainSamples into padded micro-batches that fit a token budget."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlfleet.errors import InvalidRequest, RequestTooLarge
from rlfleet.sample_checks import check_sample_shape
from rlfleet.types import TrainSample
from services.learner.flatten import flat, loss_masks
from services.learner.packing import PackedLayout
from services.learner.packing import pack as pack_layout


@dataclass
class MicroBatch:
    """Right-padded prompt+response rows; position t of `*_B_T` predicts token t+1."""

    input_ids_B_L: torch.Tensor
    attention_mask_B_L: torch.Tensor
    targets_B_T: torch.Tensor  # input_ids shifted left by one (T = L - 1)
    response_mask_B_T: torch.Tensor  # 1 where the target is a response token the model generated
    behaviour_logprobs_B_T: torch.Tensor
    advantages_B: torch.Tensor
    rewards_B: torch.Tensor
    packed: PackedLayout | None = None  # model input without padding (learner.pack_sequences)
    #: trained tokens (the response mask's sum), counted on the host when the batch is built: read per
    #: micro-batch by every metric, it would otherwise cost a device synchronisation each time
    num_tokens: int = 0


def validate_samples(samples: list[TrainSample], max_seq_len: int | None = None) -> None:
    if not samples:
        raise InvalidRequest("train batch has no samples")
    for i, s in enumerate(samples):
        check_sample_shape(i, s)
        if max_seq_len is not None and len(s.prompt_ids) + len(s.response_ids) > max_seq_len:
            raise RequestTooLarge(f"sample {i}: {len(s.prompt_ids) + len(s.response_ids)} tokens exceed "
                                  f"the model's {max_seq_len}")


def split_by_token_budget(samples: list[TrainSample], budget_tokens: int) -> list[list[TrainSample]]:
    """Greedy packing in order: a micro-batch's padded size (rows x longest row) stays within
    the budget; a single sample longer than the budget gets a micro-batch of its own."""
    batches: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    longest = 0
    for s in samples:
        length = len(s.prompt_ids) + len(s.response_ids)
        if current and max(longest, length) * (len(current) + 1) > budget_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(s)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def split_mini_batches(samples: list[TrainSample], count: int) -> list[list[TrainSample]]:
    """`count` contiguous, near-equal chunks (fewer when there are fewer samples); each is one
    optimizer step. Contiguous keeps a group's samples together, as the controller ordered them."""
    count = max(1, min(count, len(samples)))
    size, extra = divmod(len(samples), count)
    chunks, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        chunks.append(samples[start:end])
        start = end
    return chunks


def collate(samples: list[TrainSample], pad_id: int, device: torch.device, pack: bool = False) -> MicroBatch:
    """Padded rows; with ``pack`` also the packed layout the model then runs on (packing.py).

    Built with whole-array numpy indexing: a per-sample loop of small tensors took ~1/10 of a GPU
    step's time on the host for 512 samples, with the GPU idle meanwhile (bench/RESULTS.md). The
    response ids and log-probs may be lists or the data plane's numpy columns (flatten.py)."""
    prompt_len = np.array([len(s.prompt_ids) for s in samples], dtype=np.int64)
    response_len = np.array([len(s.response_ids) for s in samples], dtype=np.int64)
    lengths = prompt_len + response_len
    B, L = len(samples), int(lengths.max())
    # every token's (row, column): rows in order, each row from column 0
    rows = np.repeat(np.arange(B), lengths)
    cols = np.arange(rows.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    tokens = flat((seq for s in samples for seq in (s.prompt_ids, s.response_ids)), np.int64)
    input_ids = np.full((B, L), pad_id, dtype=np.int64)
    input_ids[rows, cols] = tokens
    attention = np.zeros((B, L), dtype=np.int64)
    attention[rows, cols] = 1
    # Response token j sits at position P + j and is predicted from position P + j - 1. A multi-turn
    # response's observation tokens (loss_mask 0) are context only: never trained on.
    r_rows = np.repeat(np.arange(B), response_len)
    r_cols = (np.arange(r_rows.size) - np.repeat(np.cumsum(response_len) - response_len, response_len)
              + np.repeat(prompt_len - 1, response_len))
    response_mask = np.zeros((B, L - 1), dtype=np.float32)
    response_mask[r_rows, r_cols] = flat(loss_masks(samples, np.float32), np.float32)
    behaviour = np.zeros((B, L - 1), dtype=np.float32)
    behaviour[r_rows, r_cols] = flat((s.behaviour_logprobs for s in samples), np.float32)
    ids = torch.from_numpy(input_ids)
    return MicroBatch(
        input_ids_B_L=ids.to(device), attention_mask_B_L=torch.from_numpy(attention).to(device),
        targets_B_T=ids[:, 1:].to(device), response_mask_B_T=torch.from_numpy(response_mask).to(device),
        behaviour_logprobs_B_T=torch.from_numpy(behaviour).to(device),
        advantages_B=torch.tensor([s.advantage for s in samples], dtype=torch.float32).to(device),
        rewards_B=torch.tensor([s.reward for s in samples], dtype=torch.float32).to(device),
        packed=pack_layout(samples, pad_id, device, tokens=tokens, lengths=lengths) if pack else None,
        num_tokens=int(response_mask.sum()))
