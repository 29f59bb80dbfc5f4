"""The code-execution sandbox: real child processes doing what a bad completion would do.

Each hostile program is stopped and, through the code reward, scored as a failed
test (0), while an honest one passes. The network test listens on loopback and
checks that nothing ever connected; the file test offers a world-writable folder
outside the sandbox so that only the sandbox can stop the write.
"""
from __future__ import annotations

import json
import os
import socket
import textwrap
from pathlib import Path

import pytest

from services.reward.fns import code as code_reward
from rlfleet.sandbox.runner import SandboxLimits, isolation, run_python

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

# A program the test needs to run to its end (or to a limit other than time) gets a wall clock far past
# what a loaded machine takes to start the interpreter (start_grace_s): 1 s was seen short at load 26.
# The tests of the time limits themselves use the tight default grace (WALL_LIMITS).
START_GRACE_S = 30.0
LIMITS = SandboxLimits(timeout_s=0.5, memory_mb=256, file_mb=1, start_grace_s=START_GRACE_S)
WALL_LIMITS = SandboxLimits(timeout_s=0.5, memory_mb=256, file_mb=1)
HONEST_TIMEOUT_S = 10.0  # the code reward has no grace of its own to set: a wall clock of 11 s
ADD_TESTS = json.dumps([{"input": "1 2\n", "output": "3\n"}, {"input": "40 2\n", "output": "42\n"}])


def score(program: str, tests: str = ADD_TESTS, timeout_s: float = HONEST_TIMEOUT_S) -> float:
    completion = f"Here is my solution:\n```python\n{textwrap.dedent(program)}\n```\n"
    return code_reward.compute_score("code", completion, tests, None, timeout_s=timeout_s,
                                     memory_mb=LIMITS.memory_mb, file_mb=LIMITS.file_mb)


def test_honest_program_passes_and_a_wrong_one_fails():
    assert score("a, b = map(int, input().split())\nprint(a + b)") == 1.0
    assert score("a, b = map(int, input().split())\nprint(a * b if a == 1 else a + b)") == 0.5
    assert score("def add(a, b):\n    return a + b",
                 json.dumps({"asserts": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]})) == 0.5


def test_infinite_loop_is_stopped():
    result = run_python("while True:\n    pass\n", limits=WALL_LIMITS)
    assert result.status == "timeout"
    assert result.seconds < WALL_LIMITS.timeout_s + WALL_LIMITS.start_grace_s + 5.0  # its limit and the kill
    assert score("while True:\n    pass", tests=json.dumps([{"input": "", "output": "3"}]),
                 timeout_s=WALL_LIMITS.timeout_s) == 0.0


def test_sleeping_program_is_stopped_by_the_wall_clock():
    result = run_python("import time\ntime.sleep(60)\n", limits=WALL_LIMITS)
    assert result.status == "timeout"
    assert result.seconds < WALL_LIMITS.timeout_s + WALL_LIMITS.start_grace_s + 5.0  # 1.5 s + kill, not 60


def test_memory_bomb_is_stopped():
    result = run_python("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\n", limits=LIMITS)
    assert result.status == "memory", result
    assert run_python("x = bytearray(8 * 2**30)\n", limits=LIMITS).status == "memory"
    assert score("data = 'x' * (4 * 2**30)\nprint(3)") == 0.0


def test_file_write_outside_its_directory_is_refused(tmp_path: Path):
    target_dir = tmp_path / "open_to_all"
    target_dir.mkdir()
    os.chmod(target_dir, 0o777)  # so that file permissions alone would not stop it
    os.chmod(tmp_path, 0o755)
    target = target_dir / "escaped.txt"
    for program in (f"open({str(target)!r}, 'w').write('gotcha')",
                    f"import os\nos.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)",
                    f"import shutil\nshutil.copyfile('solution.py', {str(target)!r})"):
        result = run_python(program, limits=LIMITS)
        assert result.status == "blocked", (program, result)
        assert "outside the working directory" in result.stderr
        assert not target.exists()
    assert score(f"open({str(target)!r}, 'w').write('x')\nprint(3)") == 0.0
    assert not target.exists()
    # Inside its own directory it may write.
    inside = run_python("open('notes.txt', 'w').write('ok')\nprint(open('notes.txt').read())", limits=LIMITS)
    assert inside.ok and inside.stdout.strip() == "ok"


def test_huge_output_is_cut_by_the_file_size_limit():
    result = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", limits=LIMITS)
    assert result.status == "output_limit"
    assert len(result.stdout) <= LIMITS.file_mb << 20


@pytest.fixture
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.3)
    yield server
    server.close()


def connect_program(port: int) -> str:
    return (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            f"s.sendall(b'leak')\nprint(3)\n")


def assert_nobody_connected(listener: socket.socket) -> None:
    with pytest.raises(socket.timeout):
        listener.accept()


def test_network_attempt_is_refused(listener):
    port = listener.getsockname()[1]
    result = run_python(connect_program(port), limits=LIMITS)
    assert result.status == "blocked" and "network access refused" in result.stderr
    assert score(connect_program(port).replace("print(3)", "print(sum(map(int, input().split())))")) == 0.0
    assert_nobody_connected(listener)


@pytest.mark.skipif(not isolation().network_namespace,
                    reason="this kernel lets no process make a network namespace")
def test_network_namespace_alone_cuts_the_network(listener):
    """Without the audit hook, the private namespace still has no way out (its loopback is down)."""
    port = listener.getsockname()[1]
    result = run_python(connect_program(port), limits=SandboxLimits(timeout_s=0.5, audit_hook=False,
                                                                      start_grace_s=START_GRACE_S))
    assert result.status == "error" and "Network is unreachable" in result.stderr, result
    assert_nobody_connected(listener)


def test_new_processes_are_refused():
    assert run_python("import os\nos.fork()", limits=LIMITS).status == "blocked"
    assert run_python("import subprocess\nsubprocess.run(['true'])", limits=LIMITS).status == "blocked"
    # The kernel limit holds without the audit hook too (RLIMIT_NPROC = 0 for a non-root user).
    if isolation().drops_to_nobody or os.geteuid() != 0:
        bare = run_python("import os\nos.fork()", limits=SandboxLimits(timeout_s=0.5, audit_hook=False,
                                                                       start_grace_s=START_GRACE_S))
        assert bare.status == "error" and "Resource temporarily unavailable" in bare.stderr, bare


def test_bad_ground_truth_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="ground truth"):
        score("print(3)", tests="not json")
    with pytest.raises(ValueError, match="fn_name"):
        score("print(3)", tests=json.dumps({"inputs": ["1"], "outputs": ["1"], "fn_name": "f"}))


def test_extract_code_takes_the_last_fenced_block():
    text = "```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```"
    assert code_reward.extract_code(text).strip() == "print(2)"
    assert code_reward.extract_code("print(5)") == "print(5)"



def test_limits_too_small_to_judge_anything_are_refused():
    with pytest.raises(ValueError, match="memory_mb >= 64"):
        SandboxLimits(memory_mb=8)
    with pytest.raises(ValueError, match="too small"):
        code_reward.compute_score("code", "print(3)", ADD_TESTS, None, timeout_s=0)
