"""Give the host memory a CPU step freed back to the operating system (`run.release_freed_memory`).

glibc keeps freed blocks in its heaps (one per thread that allocates) for later allocations, and
returns a heap's pages only from its top. A CPU learner step frees ~40-60 MB of activations and a
rollout's generation a few tens of MB, spread over the heaps of gRPC worker threads, so a resting
role holds its last step's peak: in a synchronous job the roles take turns, and each one's rest
adds to the other's peak. ``malloc_trim(0)`` hands the free pages of every heap back (~1-3 ms),
and the next step faults them in again. On the small CPU job (bench/RESULTS.md, "Memory of the
small CPU job") that was ~90 MB less summed RSS for 1-6 % more CPU per sample and a median 6 %
fewer samples/s in sync mode, hence off by default. Elsewhere than glibc this does nothing.

`one_heap_for_all_threads` (on for every CPU role, at no measured cost) keeps those freed blocks in
one heap instead of one per thread, so a step reuses the previous step's blocks whichever thread runs it.
"""
from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

_after_each_step = False


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to call
        return None


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


_M_ARENA_MAX = -8  # glibc's malloc.h


def one_heap_for_all_threads() -> bool:
    """Make every thread allocate from the main heap (glibc `mallopt(M_ARENA_MAX, 1)`); call it before
    the process starts its threads. False where the C library has no mallopt, or where MALLOC_ARENA_MAX
    is set in the environment.

    Why: glibc gives each thread that allocates concurrently a heap of its own, and a heap keeps the
    freed blocks of its largest step. A CPU role's steps run on whichever gRPC worker thread takes the
    call, so after a few steps several heaps each hold a step's worth of freed activations or decode
    buffers: the learner and rollout of the small CPU job drifted up by tens of MB over their first
    steps, and their peaks varied by ~70 MB from run to run. With one heap the next step reuses the
    last one's blocks. Threads mostly allocate small blocks from glibc's per-thread caches, which
    take no lock, and a CPU role computes on one thread, so the shared heap costs no measurable
    time (bench/RESULTS.md, "Memory of the small CPU job")."""
    if "MALLOC_ARENA_MAX" in os.environ:  # glibc read the operator's own setting at start: it stands
        return False
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_ARENA_MAX, 1) == 1


def release_freed_memory() -> bool:
    """Return free heap pages to the OS; False where the C library has no malloc_trim."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def release_after_each_step(on: bool) -> None:
    """Set once by the service at start, from `run.release_freed_memory`."""
    global _after_each_step
    _after_each_step = on


def step_done() -> bool:
    """Called by a CPU role after each step: releases freed memory when the service asked for it."""
    return _after_each_step and release_freed_memory()
