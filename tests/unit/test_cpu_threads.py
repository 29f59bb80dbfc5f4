"""The torch CPU thread count of the services and of the commands that compute (rlfleet/cpu_threads.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlfleet.cpu_threads import ENV, chosen_threads, share_of_cores

pytestmark = pytest.mark.unit


def test_share_of_cores_is_half_the_cores_and_at_least_one() -> None:
    # 2 cores: 2 // 2 = 1; 16: 8; 3: 1 (rounded down); 1 core: 1 // 2 = 0, raised to 1.
    assert [share_of_cores(n) for n in (2, 16, 3, 1)] == [1, 8, 1, 1]


def test_a_configured_count_wins_then_omp_num_threads_then_the_share(monkeypatch) -> None:
    monkeypatch.setenv(ENV, "3")
    assert chosen_threads(5) == 5
    assert chosen_threads() == 3
    for unusable in ("0", "", "two"):
        monkeypatch.setenv(ENV, unusable)
        assert chosen_threads() == share_of_cores()
    monkeypatch.delenv(ENV)
    assert chosen_threads() == share_of_cores()


@pytest.mark.parametrize("torch_first", [False, True])
def test_limit_threads_holds_whether_torch_is_imported_before_or_after(torch_first: bool) -> None:
    # one thread: torch caps OMP_NUM_THREADS at the cores (3 on this 2-core machine gave 2), and its own
    # default is one per core, so 1 differs from the default wherever there are two cores or more
    code = ("import torch\n" if torch_first else "") + (
        "from rlfleet.cpu_threads import limit_threads\n"
        "n = limit_threads(1)\n"
        "import torch\n"
        "print(n, torch.get_num_threads())\n")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]


def test_limit_threads_holds_where_libgomp_is_preloaded() -> None:
    """vLLM's CPU platform puts torch's libgomp in LD_PRELOAD (for the processes after it; an in-process
    vLLM test leaves it in the suite worker's environment): libgomp then reads OMP_NUM_THREADS when the
    process starts, so setting it before `import torch` changed nothing and a command computed with 2
    threads, not 1 (the fresh-clone suite failed the test above so)."""
    import glob

    import torch

    lib = next(iter(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*.so*"))
                    + glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "torch.libs",
                                             "libgomp*.so*"))), None)
    if lib is None:
        pytest.skip("this torch build has no libgomp of its own")
    code = ("from rlfleet.cpu_threads import limit_threads\n"
            "n = limit_threads(1)\n"
            "import torch\n"
            "print(n, torch.get_num_threads())\n")
    env = {**{k: v for k, v in os.environ.items() if k != ENV}, "LD_PRELOAD": lib}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]
