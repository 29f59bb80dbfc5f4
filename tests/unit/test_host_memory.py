"""rlfleet/host_memory.py on glibc: one heap for every thread of a CPU role."""
from __future__ import annotations

import ctypes.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

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
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.split()[-1])


@pytest.mark.skipif(ctypes.util.find_library("c") != "libc.so.6" or not sys.platform.startswith("linux"),
                    reason="glibc only")
def test_after_one_heap_for_all_threads_new_threads_allocate_from_the_main_heap() -> None:
    assert heaps("default") > 1  # the setting is what makes the difference here
    assert heaps("one") == 1
