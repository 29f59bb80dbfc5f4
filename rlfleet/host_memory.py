"""Give the host memory a CPU step freed back to the operating system.

glibc keeps freed blocks in its heaps (one per thread that allocates) for the next allocation of
that thread, and returns a heap's pages only from its top. A CPU learner step frees ~40-60 MB of
activations and a rollout's generation a few tens of MB, spread over the heaps of gRPC worker
threads, so between steps each role held memory it was not using: in a synchronous job the roles
take turns, and every resting role kept its last step's peak. ``malloc_trim(0)`` hands the free
pages of every heap back (~1-3 ms); the next step faults them in again, which measured no slower
(bench/RESULTS.md, "Memory of the small CPU job"). Elsewhere than glibc this does nothing.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to call
        return None


def release_freed_memory() -> bool:
    """Return free heap pages to the OS; False where the C library has no malloc_trim."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
