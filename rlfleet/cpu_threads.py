"""How many CPU threads torch computes with, in one place: the services of `rlfleet run` and the commands
that compute in their own process (`rlfleet sft`, `eval`, `data`, `model import`, `build-model`).

torch starts one OpenMP thread per core, and its threads spin while they wait for each other: on a
shared 2-core machine with other work running, an SFT step of the tiny model took ~10 s (181 tok/s)
with torch's default and ~1.5 s (2,337 tok/s) with one thread (issue 43). Measured again (2026-12-05,
2 cores, 2 threads = torch's default vs 1 = this share): with two other busy processes, 30 SFT steps of
the tiny model 46-57 s vs 14-16 s of wall time and a calculator `rlfleet eval` of 16 episodes 25-30 s vs
14-17 s; alone, one thread costs (0.083 vs 0.134 s per SFT step). A run gives each of its busy
services (rollout, learner) half the cores; a command takes the same share, so it leaves room for the
rest of the machine. OMP_NUM_THREADS, when set, is the user's choice and wins.

No torch import here: a command that never computes (`rlfleet data arithmetic`) should not pay for one.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

ENV = "OMP_NUM_THREADS"


def share_of_cores(cores: int | None = None) -> int:
    """Half of `cores` (default: this machine's), at least one."""
    return max(1, (cores if cores is not None else os.cpu_count() or 2) // 2)


def chosen_threads(configured: int = 0) -> int:
    """`configured` when > 0 (run.threads_per_service), else OMP_NUM_THREADS when it is a positive
    number, else share_of_cores()."""
    if configured > 0:
        return configured
    given = os.environ.get(ENV, "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return share_of_cores()


def limit_threads(configured: int = 0) -> int:
    """Makes this process compute with chosen_threads(configured) torch threads and returns the number.
    It sets OMP_NUM_THREADS (for the processes this one starts: torchrun's ranks) and calls
    torch.set_num_threads: now if torch is imported, else as soon as it is. The variable alone is not
    enough: where torch's libgomp is preloaded (vLLM's CPU platform puts it in LD_PRELOAD) the OpenMP
    runtime read it when the process started."""
    threads = chosen_threads(configured)
    os.environ[ENV] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    elif not any(isinstance(f, _ThreadsAfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ThreadsAfterTorchImport(threads))
    return threads


class _ThreadsAfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds `torch` with the other finders and has its loader call torch.set_num_threads once the module
    has run; then leaves sys.meta_path (no cost to later imports)."""

    def __init__(self, threads: int):
        self.threads = threads

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201 - importlib's signature
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module, threads = spec.loader.exec_module, self.threads

        def exec_module(module) -> None:  # noqa: ANN001
            run_module(module)
            module.set_num_threads(threads)

        spec.loader.exec_module = exec_module
        return spec
