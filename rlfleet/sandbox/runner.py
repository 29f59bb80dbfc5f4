"""Runs untrusted Python (a policy's completion) in a confined child process.

`run_python(code, stdin, limits)` writes the code into a fresh temporary
directory and starts `sandbox_child.py` there with a fresh interpreter, in a
session of its own. The child confines itself before running the code (see its
docstring): resource limits (CPU time, address space, file size, open files, no
processes or threads), a private network namespace when the kernel allows it,
the `nobody` user when started as root, and an audit hook that refuses sockets,
new processes, ctypes and writes outside its directory. The parent enforces the
wall-clock limit, kills the whole session afterwards and deletes the directory.

The guard protects the machine from the code. It does not make the reward
tamper-proof against code written to forge its own result.
"""
from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")
EXIT_MEMORY, EXIT_BLOCKED, EXIT_SETUP = 101, 102, 103
NOBODY = 65534


class SandboxError(RuntimeError):
    """The sandbox itself failed: no verdict on the code can be given (the sample is reported)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # CPU seconds for the solution; the wall clock allows start_grace_s more
    start_grace_s: float = 1.0  # interpreter start-up on a loaded machine
    memory_mb: int = 512  # address space
    file_mb: int = 8  # largest file, stdout and stderr included
    network_namespace: bool | None = None  # None: when available (see `isolation()`)
    audit_hook: bool = True

    def __post_init__(self) -> None:
        # Below ~16 MB the interpreter itself cannot start: every program would "fail", silently.
        if self.memory_mb < 64 or self.timeout_s <= 0 or self.file_mb < 1:
            raise ValueError(f"sandbox limits too small to judge anything: {self} "
                             f"(need memory_mb >= 64, timeout_s > 0, file_mb >= 1)")


@dataclass(frozen=True)
class SandboxResult:
    status: str  # ok | error | timeout | memory | blocked | output_limit
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Isolation:
    network_namespace: bool
    drops_to_nobody: bool

    def describe(self) -> str:
        net = "private network namespace + audit hook" if self.network_namespace else "audit hook only"
        user = "runs as nobody" if self.drops_to_nobody else "runs as the service's user"
        return f"network: {net}; {user}; rlimits: cpu, address space, file size, nproc=0, nofile"


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """What this machine allows; probed once by running a child that leaves the network."""
    probe = ("import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
             "ok = libc.unshare(0x40000000) == 0 or (os.geteuid() != 0 and "
             "libc.unshare(0x50000000) == 0); sys.exit(0 if ok else 1)")
    try:
        rc = subprocess.run([sys.executable, "-I", "-c", probe], timeout=30, capture_output=True,
                            check=False).returncode
    except (OSError, subprocess.TimeoutExpired):
        rc = 1
    return Isolation(network_namespace=rc == 0, drops_to_nobody=os.geteuid() == 0)


def run_python(code: str, stdin: str = "", limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    workdir = Path(tempfile.mkdtemp(prefix="rlfleet-sandbox-"))
    try:
        return _run(workdir, code, stdin, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(workdir: Path, code: str, stdin: str, limits: SandboxLimits) -> SandboxResult:
    netns = isolation().network_namespace if limits.network_namespace is None else limits.network_namespace
    (workdir / "solution.py").write_text(code)
    (workdir / "stdin.txt").write_text(stdin)
    config = workdir / "sandbox.json"
    config.write_text(json.dumps({
        "workdir": str(workdir), "cpu_s": max(1, math.ceil(limits.timeout_s)), "memory_mb": limits.memory_mb,
        "file_mb": limits.file_mb, "network_namespace": netns, "audit_hook": limits.audit_hook}))
    if os.geteuid() == 0:  # the child becomes nobody: hand it its directory
        for path in (workdir, *workdir.iterdir()):
            os.chown(path, NOBODY, NOBODY)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8"}
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    started = time.monotonic()
    timed_out = False
    with open(workdir / "stdin.txt", "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
        proc = subprocess.Popen([sys.executable, "-I", str(CHILD), str(config)], cwd=workdir, stdin=fin,
                                stdout=fout, stderr=ferr, env=env, start_new_session=True, close_fds=True)
        try:
            proc.wait(timeout=limits.timeout_s + limits.start_grace_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_session(proc.pid)
        proc.wait()
    seconds = time.monotonic() - started
    stdout, stderr = _read(out_path, limits.file_mb), _read(err_path, limits.file_mb)
    if proc.returncode == EXIT_SETUP:
        raise SandboxError(stderr.strip()[-2000:] or "the sandbox could not be set up")
    status = _classify(proc.returncode, timed_out, stderr)
    return SandboxResult(status, proc.returncode, stdout, stderr[-4000:], seconds)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read(path: Path, limit_mb: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit_mb << 20).decode("utf-8", errors="replace")


def _classify(returncode: int, timed_out: bool, stderr: str) -> str:
    if timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if returncode == EXIT_MEMORY or (returncode != 0 and "MemoryError" in stderr):
        return "memory"
    if returncode == EXIT_BLOCKED:
        return "blocked"
    if returncode == -signal.SIGXFSZ or "[Errno 27]" in stderr:
        return "output_limit"
    return "ok" if returncode == 0 else "error"
