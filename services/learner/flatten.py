"""One array from the samples' per-sample sequences, whatever their form: Python lists (the inline
path, a sharded learner's other ranks) or numpy views of the data plane's columns (int32 ids, float32
log-probs: rlfleet/dataplane/columns.py). One conversion per sequence, never a loop per token, and the
same values either way (a float32 log-prob converts exactly, from a Python float or a float32)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def flat(sequences: Iterable[Sequence], dtype) -> np.ndarray:
    arrays = [np.asarray(x, dtype=dtype) for x in sequences]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def loss_masks(samples: Iterable, dtype) -> Iterable[Sequence]:
    """Each sample's loss mask, all ones where it has none (None or empty: every token is trained on)."""
    for s in samples:
        mask = s.loss_mask
        yield mask if mask is not None and len(mask) else np.ones(len(s.response_ids), dtype=dtype)
