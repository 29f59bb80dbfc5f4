"""What makes Train idempotent: the results of the last steps, keyed by (step, expected version).

A Train call can fail at the caller while the learner goes on to apply it (the deadline passed
during a long step, the connection dropped after the request arrived). Retrying such a call
would move the policy two versions. So a batch that says which version it expects is keyed by
(step, expected_version); a repeat of a key already applied gets the stored result and trains
nothing. A batch without an expected version (-1, direct Python callers only: the RPC layer
refuses it) is neither looked up nor stored.

The batch's content is fingerprinted too: the same key with other samples is not a repeat, and
falls through to the usual version check, which refuses it.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import replace

import numpy as np

from rlfleet.types import TrainBatch, TrainResult

# The controller trains one step at a time: only the last step can be retried. A few more cost
# nothing (metrics only) and cover a retry that arrives after a replayed step.
KEEP = 4


def fingerprint(batch: TrainBatch) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(struct.pack("<qd", len(batch.samples), batch.temperature))
    for s in batch.samples:
        digest.update(struct.pack("<qqqdd", len(s.prompt_ids), len(s.response_ids), s.generation_version,
                                  s.advantage, s.reward))
        # int64 / float64 whatever the form (lists, or the data plane's int32 / float32 columns): the same
        # bytes for the same values, so a retry is recognised whichever path brought it
        digest.update(np.asarray(s.prompt_ids, np.int64).tobytes())
        digest.update(np.asarray(s.response_ids, np.int64).tobytes())
        digest.update(np.asarray(s.behaviour_logprobs, np.float64).tobytes())
    return digest.digest()


class StepResults:
    """The learner holds one, and consults it under its train lock."""

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._results: OrderedDict[tuple[int, int], tuple[bytes, TrainResult]] = OrderedDict()

    def lookup(self, batch: TrainBatch) -> TrainResult | None:
        """The stored result of this very batch (marked `repeated`), or None: train it."""
        if batch.expected_version < 0:
            return None
        found = self._results.get((batch.step, batch.expected_version))
        if found is None or found[0] != fingerprint(batch):
            return None
        return replace(found[1], repeated=True)

    def record(self, batch: TrainBatch, result: TrainResult) -> None:
        if batch.expected_version < 0:
            return
        self._results[(batch.step, batch.expected_version)] = (fingerprint(batch), result)
        while len(self._results) > self.keep:
            self._results.popitem(last=False)

    def clear(self) -> None:
        """After loading a checkpoint: results of steps trained before it say nothing about the new state."""
        self._results.clear()
