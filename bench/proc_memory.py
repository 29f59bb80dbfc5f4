"""Memory of a process tree, sampled while it runs: summed RSS and PSS, and a per-process split.

Read from /proc (Linux): RSS from /proc/PID/status, PSS from /proc/PID/smaps_rollup (shared
pages split between the processes sharing them, so the PSS sum does not count a shared
library once per process as the RSS sum does). Each process is labelled by its command line
(`serve rollout` -> rollout, a multiprocessing worker -> its parent's label + "-worker", ...).
The figure kept is the largest sum seen over the samples, with each label's value at that moment.
With `gpu=True` each sample also asks nvidia-smi for the GPU memory of the tree's processes.
"""
from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def _children_by_parent() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(root: int) -> list[int]:
    tree, out, todo = _children_by_parent(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def _kib(path: str, key: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def default_label(cmd: list[str]) -> str:
    text = " ".join(cmd)
    if "multiprocessing.resource_tracker" in text or "resource_tracker" in text:
        return "mp-helper"
    if "multiprocessing" in text or "--multiprocessing-fork" in text:
        return "worker"
    for role in ("rollout", "reward", "learner"):
        if f"serve {role}" in text:
            return role
    if "rlfleet.app.cli run" in text:
        return "launcher+controller"
    if "e2e_trl" in text or "small_job_trl" in text:
        return "trl"
    return Path(cmd[0]).name if cmd and cmd[0] else "?"


@dataclass
class MemoryPeak:
    rss_mb: float = 0.0
    pss_mb: float = 0.0
    by_label_rss: dict[str, float] = field(default_factory=dict)
    by_label_pss: dict[str, float] = field(default_factory=dict)
    processes: int = 0
    gpu_mb: float = 0.0  # largest GPU memory summed over the tree (gpu=True)
    by_label_gpu: dict[str, float] = field(default_factory=dict)


def gpu_memory_by_pid() -> dict[int, float]:
    """MB of GPU memory per process, as nvidia-smi reports it ({} without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    used: dict[int, float] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            used[int(parts[0])] = used.get(int(parts[0]), 0.0) + float(parts[1] or 0)
    return used


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds used so far by the live processes of the tree under `root`."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in descendants(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15 of stat)
    return total


class TreeMemory:
    """Samples the tree under `root_pid` every `interval_s` in a thread until `stop()`."""

    def __init__(self, root_pid: int, interval_s: float = 0.5,
                 label: Callable[[list[str]], str] = default_label, gpu: bool = False):
        self.root_pid, self.interval_s, self.label, self.gpu = root_pid, interval_s, label, gpu
        self.peak = MemoryPeak()
        self._labels: dict[int, str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)
        self._thread.start()

    def _label_of(self, pid: int, parent_label: str | None) -> str:
        if pid not in self._labels:
            label = self.label(_cmdline(pid))
            if label == "worker" and parent_label:
                label = f"{parent_label}-worker"
            self._labels[pid] = label
        return self._labels[pid]

    def sample(self) -> None:
        tree = _children_by_parent()
        rss: dict[str, float] = {}
        pss: dict[str, float] = {}
        todo: list[tuple[int, str | None]] = [(self.root_pid, None)]
        count = 0
        while todo:
            pid, parent = todo.pop()
            label = self._label_of(pid, parent)
            r = _kib(f"/proc/{pid}/status", "VmRSS:") / 1024
            p = _kib(f"/proc/{pid}/smaps_rollup", "Pss:") / 1024
            if r:
                count += 1
                rss[label] = rss.get(label, 0.0) + r
                pss[label] = pss.get(label, 0.0) + p
            todo.extend((child, label) for child in tree.get(pid, []))
        total = sum(rss.values())
        gpu: dict[str, float] = {}
        if self.gpu:
            for pid, mb in gpu_memory_by_pid().items():
                if pid in self._labels:
                    gpu[self._labels[pid]] = gpu.get(self._labels[pid], 0.0) + mb
            if sum(gpu.values()) > self.peak.gpu_mb:
                self.peak.gpu_mb, self.peak.by_label_gpu = sum(gpu.values()), gpu
        if total > self.peak.rss_mb:
            self.peak = MemoryPeak(total, sum(pss.values()), rss, pss, count, self.peak.gpu_mb,
                                   self.peak.by_label_gpu)

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            self.sample()

    def stop(self) -> MemoryPeak:
        self._done.set()
        self._thread.join()
        return self.peak
