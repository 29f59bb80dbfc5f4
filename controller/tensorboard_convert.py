"""The run's scalars (and a few texts) converted to TensorBoard's event protos and appended to its
event files: the one place the controller touches protobuf classes for its outputs
(controller/outputs.py stays free of them, as every core module does)."""
from __future__ import annotations

import time
from pathlib import Path


class ScalarEvents:
    """TensorBoard scalars through tensorboard's own event-file writer: the same files (one per
    writer, Event protos of Summary simple_values) as torch.utils.tensorboard.SummaryWriter, which
    wraps this very writer, without importing torch into the controller (~190 MB resident and ~2 s
    of start-up on the default run, where TensorBoard is on and nothing else needs torch)."""

    def __init__(self, log_dir: Path):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._writer = EventFileWriter(str(log_dir))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=value)])
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def add_text(self, tag: str, text: str, step: int) -> None:
        """Markdown in TensorBoard's text tab."""
        from tensorboard.plugins.text.summary_v2 import text_pb

        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=text_pb(tag, text)))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
