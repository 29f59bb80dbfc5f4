"""rlfleet/host_memory.py on glibc Linux: release_freed_memory gives freed heap pages back (the resident
size falls); one_heap_for_all_threads makes new threads allocate from the main heap."""
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


HEAPS = textwrap.dedent("""
    import ctypes, sys, tempfile, threading
    from rlfleet import host_memory
    if sys.argv[1] == "one":
        assert host_memory.one_heap_for_all_threads()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.fopen.restype = ctypes.c_void_p
    start = threading.Barrier(4)

    def allocate():
        start.wait()  # all four at once: glibc would give each a heap of its own
        libc.free(ctypes.c_void_p(libc.malloc(1 << 16)))

    threads = [threading.Thread(target=allocate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        f = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(f))
        libc.fclose(ctypes.c_void_p(f))
        print(open(out.name).read().count("<heap nr="))
""")


def heaps(mode: str) -> int:
    proc = subprocess.run([sys.executable, "-c", HEAPS, mode], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_after_one_heap_for_all_threads_new_threads_allocate_from_the_main_heap() -> None:
    assert heaps("default") > 1  # the setting is what makes the difference here
    assert heaps("one") == 1


def test_an_arena_limit_set_in_the_environment_is_left_as_it_is(monkeypatch) -> None:
    from rlfleet import host_memory

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert host_memory.one_heap_for_all_threads() is False
