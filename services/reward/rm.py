"""Reward model core: any HF sequence-classification model with one label scores prompt + response.

The text scored is the item's prompt followed by its response (the prompt is
already rendered with the policy's chat template). Inputs longer than
`max_length` tokens lose the start of the prompt, never the response. Items are
scored in batches of `batch_size`, right-padded; the model reads its score at
the last real token (transformers does this from the pad token id, set here when
the tokenizer has none).
"""
from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path

import structlog
import torch

from rlfleet.errors import ConfigError
from rlfleet.types import ScoreItem, ScoreResult
from services.reward.scorer import ScoringCancelled, check_items

log = structlog.get_logger(__name__)


class RewardModel:
    def __init__(self, path: str | Path, device: torch.device, dtype: torch.dtype, batch_size: int = 16,
                 max_length: int = 2048):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not Path(path).is_dir():
            raise ConfigError(f"reward.model.path = {str(path)!r}: not a model folder")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).to(device).eval()
        if self.model.config.num_labels != 1:
            raise ConfigError(f"reward.model.path = {str(path)!r}: a reward model has num_labels=1, "
                              f"this one has {self.model.config.num_labels}")
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device, self.batch_size, self.max_length = device, batch_size, max_length
        self._lock = threading.Lock()  # concurrent calls take turns: one batch on the device at a time
        log.info("reward model loaded", path=str(path), device=str(device), dtype=str(dtype))

    @torch.no_grad()
    def values(self, texts: list[str]) -> list[float]:
        """One scalar per text, batched."""
        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=True, max_length=self.max_length, add_special_tokens=False)
            with self._lock:
                logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits
            out.extend(logits[:, 0].float().cpu().tolist())
        return out

    def score(self, items: list[ScoreItem], active: Callable[[], bool] | None = None) -> list[ScoreResult]:
        check_items(items)
        results: list[ScoreResult] = []
        for start in range(0, len(items), self.batch_size):
            if active is not None and not active():
                raise ScoringCancelled(f"the caller left after {len(results)} of {len(items)} items")
            chunk = items[start:start + self.batch_size]
            for item, value in zip(chunk, self.values([i.prompt + i.response for i in chunk])):
                if math.isfinite(value):
                    results.append(ScoreResult(id=item.id, score=value))
                else:
                    results.append(ScoreResult(id=item.id, score=0.0, ok=False,
                                               error=f"reward model returned {value}"))
        return results
