"""Real containers for the `containers` tests: podman, the CPU image, podman's Docker API, health checks.

The runtime is installed the way CI installs it (tests/deploy/install-container-runtime.sh) when it
is missing; the image is built by deploy/build-cpu-image.sh from this checkout, whose base image
(deploy/build-local-base.sh) and unchanged layers podman reuses, so a second session rebuilds at
most the rlfleet layer.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "tests" / "deploy" / "install-container-runtime.sh"
IMAGE = "localhost/rlfleet:cpu"


def run(argv: list[str], timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )
    return proc


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return run(["podman", *args], timeout=timeout, check=check)


def require_podman() -> None:
    """Installs podman as CI does when it is missing; fails (never skips) when that is impossible."""
    if shutil.which("podman") and Path("/etc/containers/containers.conf.d/50-rlfleet.conf").is_file():
        return
    proc = run(["bash", str(INSTALL)], timeout=900, check=False)
    if proc.returncode != 0 or not shutil.which("podman"):
        pytest.fail(f"no container runtime and {INSTALL.name} could not install it: {proc.stderr[-2000:]}")


def build_cpu_image() -> str:
    """The CPU image of this checkout (podman's layer cache makes an unchanged rebuild take seconds)."""
    env = dict(os.environ)
    wheels = [d for d in os.environ.get("PIP_FIND_LINKS", "").split() if list(Path(d).glob("torch-*.whl"))]
    if wheels:  # a host that keeps the torch wheel on disk (the development machine, CI)
        env["TORCH_WHEELS"] = wheels[0]
    run(["bash", str(REPO / "deploy" / "build-cpu-image.sh"), IMAGE], timeout=1800, env=env)
    return IMAGE


def wait_for(predicate: Callable[[], object], timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def hard_limits(pid: int | str = "self") -> dict[str, int]:
    """Hard limits of a process (-1: unlimited) for the ulimits compose and systemd ask for."""
    names = {"Max open files": "nofile", "Max locked memory": "memlock", "Max processes": "nproc",
             "Max stack size": "stack"}
    limits = {}
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        for label, key in names.items():
            if line.startswith(label):
                hard = line[len(label):].split()[1]
                limits[key] = -1 if hard == "unlimited" else int(hard)
    return limits


def can_raise_limits() -> bool:
    """Root without CAP_SYS_RESOURCE (a sandboxed CI runner) cannot raise a hard limit."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if hard == resource.RLIM_INFINITY:
            return True
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard + 1))
    except (ValueError, OSError):
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # lowering back is always allowed
    return True


class DockerApi:
    """`podman system service`: the Docker API on a socket of its own, for docker-compose."""

    def __init__(self, folder: Path):
        self.socket = folder / "podman.sock"
        self.log = folder / "podman-service.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                ["podman", "system", "service", "--time=0", f"unix://{self.socket}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        wait_for(self.socket.exists, 30, "podman's API socket")

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class HealthTicker:
    """Runs the containers' health checks every few seconds. podman schedules them with systemd
    timers; on a host without systemd (CI, this machine) nothing runs them and a container stays
    `starting` for ever, so compose's `service_healthy` never holds. This is what those timers do."""

    def __init__(self, label_filter: str, every_s: float = 3.0):
        self.label_filter = label_filter
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            ids = podman("ps", "-q", "--filter", self.label_filter, "--filter", "status=running",
                         check=False).stdout.split()
            for cid in ids:
                podman("healthcheck", "run", cid, timeout=60, check=False)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=90)


def built_tiny_models() -> list[Path]:
    """The embedded tiny model, built on this host (the main suite has usually built it already):
    seeding a container's cache with it saves its ~300-step warm start, minutes on a busy 2-core
    machine. The folder name carries a hash of the recipe, so the containers take it as their own."""
    from rlfleet.models.tiny import ensure_tiny_model

    return [ensure_tiny_model()]
