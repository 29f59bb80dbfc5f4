"""Profiler traces of chosen steps of a running service, for finding where a step's time goes.

A benchmark that calls the learner or the decode loop directly misses what only the running
service does (the batch as it arrives over gRPC, shapes that change every step, a GPU shared
with the other role). Two environment variables, read once per process, trace chosen calls of
the service as it runs:

  RLFLEET_PROFILE_STEPS=8,9   which calls: the learner's train steps by step number, the rollout's
                              generation chunks by their count in that process (1 = the first)
  RLFLEET_PROFILE_DIR=DIR     where the traces go (default: the working directory)

Each traced call writes ``DIR/<role>-<n>.txt`` (the operators by self GPU time and by CPU time,
and the call's wall time) and ``DIR/<role>-<n>.json.gz`` (a Chrome/Perfetto trace). Nothing
is imported or timed for calls that are not traced.
"""
from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

STEPS_ENV = "RLFLEET_PROFILE_STEPS"
DIR_ENV = "RLFLEET_PROFILE_DIR"


def parse_steps(text: str) -> frozenset[int]:
    """``"8,9"`` -> {8, 9}; an entry that is not a positive integer is an error naming it."""
    steps = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{STEPS_ENV}: {part!r} is not a positive step number")
        steps.add(int(part))
    return frozenset(steps)


class StepProfiler:
    """Traces the calls of one role named by RLFLEET_PROFILE_STEPS (none when it is unset)."""

    def __init__(self, role: str, environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        self.role = role
        self.steps = parse_steps(env.get(STEPS_ENV, ""))
        self.out_dir = Path(env.get(DIR_ENV) or ".")
        self.calls = 0  # for roles whose calls carry no step number

    def next_call(self) -> int:
        self.calls += 1
        return self.calls

    @contextlib.contextmanager
    def trace(self, step: int) -> Iterator[None]:
        if step not in self.steps:
            yield
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        start = time.perf_counter()
        with profile(activities=activities, record_shapes=True) as prof:
            yield
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        self._write(prof, step, time.perf_counter() - start, gpu=len(activities) > 1)

    def _write(self, prof, step: int, seconds: float, gpu: bool) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        base = self.out_dir / f"{self.role}-{step}"
        events = prof.key_averages()
        sections = [f"{self.role} call {step}: {seconds * 1e3:.1f} ms wall (profiler overhead included)\n"]
        if gpu:
            sections.append("== by self GPU time ==\n" + events.table(sort_by="self_device_time_total",
                                                                     row_limit=45, max_name_column_width=70))
        sections.append("== by total CPU time ==\n" + events.table(sort_by="cpu_time_total", row_limit=35,
                                                                  max_name_column_width=70))
        base.with_suffix(".txt").write_text("\n".join(sections))
        trace = base.with_suffix(".json")
        prof.export_chrome_trace(str(trace))
        with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
