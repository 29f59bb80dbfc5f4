"""release_freed_memory gives freed heap pages back: the resident size falls (glibc Linux only)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter: freeing one 8 MB block raises glibc's mmap threshold, so the 1 MB blocks
# after it come from the heap; freed out of order behind a block still in use at the heap's top,
# they stay resident until trimmed.
SCRIPT = textwrap.dedent("""
    import ctypes
    from rlfleet.host_memory import release_freed_memory

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    big = libc.malloc(8 << 20)
    ctypes.memset(big, 1, 8 << 20)
    libc.free(big)
    blocks = [libc.malloc(1 << 20) for _ in range(200)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    keep = libc.malloc(1 << 20)  # holds the heap's top: plain free() cannot shrink the heap
    for b in blocks:
        libc.free(b)
    before = rss_mb()
    assert release_freed_memory()
    print(before, rss_mb())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_freed_memory_returns_freed_heap_pages() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = map(int, out.stdout.split())
    assert before - after >= 150, (before, after)  # ~200 MB freed and still resident before the trim


def test_a_role_releases_after_its_steps_only_when_the_service_asked() -> None:
    from rlfleet import host_memory

    assert host_memory.step_done() is False  # run.release_freed_memory is off by default
    host_memory.release_after_each_step(True)
    try:
        assert host_memory.step_done() is sys.platform.startswith("linux")
    finally:
        host_memory.release_after_each_step(False)
