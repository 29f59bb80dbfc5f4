"""Everything a run writes: metrics.jsonl, TensorBoard scalars and sample records.

`sinks` (controller/tracking.py: Weights & Biases) get every metrics line too. TensorBoard's event
protos are made in controller/tensorboard_convert.py, so this module stays free of protobuf code.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import orjson

from controller.tensorboard_convert import ScalarEvents


class RunWriter:
    def __init__(self, run_dir: Path, tensorboard: bool = True, sinks: list[Any] | None = None):
        self.run_dir = run_dir
        self._sinks = list(sinks or [])
        for sub in ("samples", "checkpoints", "logs", "tensorboard"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self._metrics = open(run_dir / "metrics.jsonl", "a", buffering=1)
        self._samples = open(run_dir / "samples" / "train.jsonl", "ab")  # noqa: SIM115 - open for the run
        self._tb = ScalarEvents(run_dir / "tensorboard") if tensorboard else None

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in metrics.items()}
        self._metrics.write(json.dumps(clean) + "\n")
        if self._tb is not None:
            step = int(metrics["step"])
            for key, value in metrics.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, float(value), step)
            self._tb.flush()  # a live TensorBoard shows each step as it ends
        for sink in self._sinks:
            sink.log(metrics)

    def log_texts(self, step: int, texts: dict[str, str]) -> None:
        """Texts by tag (Markdown) to TensorBoard's text tab: a few samples of each evaluation."""
        if self._tb is not None and texts:
            for tag, text in texts.items():
                self._tb.add_text(tag, text, step)
            self._tb.flush()

    def log_samples(self, records: list[dict[str, Any]]) -> None:
        """One line a record, all in the file (the OS) when it returns; orjson's compact lines in one
        write: 16 records (a group) cost ~8 us, against ~69 us as json.dumps a line through a
        line-buffered text file (issue 44). A non-finite float is written null."""
        lines = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS
        self.write_sample_lines(b"".join(orjson.dumps(r, option=lines) for r in records))

    def write_sample_lines(self, lines: bytes) -> None:
        """Lines made already (controller/sample_lines.py), all in the file (the OS) when it returns."""
        self._samples.write(lines)
        self._samples.flush()

    def close(self) -> None:
        self._metrics.close()
        self._samples.close()
        if self._tb is not None:
            self._tb.close()
        for sink in self._sinks:
            sink.close()

