"""A single-node Slurm cluster for tests: munged, slurmctld and slurmd from Debian's packages
(slurm-wlm, munge), run as root in the foreground from a temporary folder, on free loopback ports.

Nothing under /etc is used: a fresh munge key and socket, a slurm.conf naming this host as both
controller and the only compute node (NodeAddr 127.0.0.1), state and spool folders, all in the
temporary folder; client commands find the cluster through SLURM_CONF in `cluster.env`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.free_ports import port_for_later

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel", "srun")
WHY_MISSING = "Slurm is not installed (Debian packages slurm-wlm and munge); CI installs them in .ci/run"


def require_slurm() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        why = f"{WHY_MISSING}; missing {', '.join(missing)}"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs slurmd as root (it starts job steps as the submitting user)")


class SlurmCluster:
    def __init__(self, root: Path, gpus: int = 0):
        """`gpus`: GPUs the node offers as generic resources (gres/gpu). Their device files are
        empty files here, so jobs can ask for GPUs and Slurm hands them out to job steps, while
        the processes themselves see no GPU."""
        self.root = root
        self.gpus = gpus
        self.host = socket.gethostname().split(".")[0]  # slurmctld must find itself in SlurmctldHost
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- daemons -------------------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = munge / "munge.socket"
        self._daemon(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), 20, "munged to open its socket")
        for folder in ("state", "spool", "log"):
            (self.root / folder).mkdir()
        if self.gpus:
            for i in range(self.gpus):
                (self.root / f"gpu{i}").touch()
            (self.root / "gres.conf").write_text(
                f"NodeName={self.host} Name=gpu File={self.root}/gpu[0-{self.gpus - 1}]\n"
            )
        self.conf.write_text(self._slurm_conf())
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._daemon("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.host])
        self._wait(self._node_idle, 60, "the node to be idle")
        return self

    def _slurm_conf(self) -> str:
        r = self.root
        return "\n".join(
            [
                "ClusterName=rlfleet-test",
                *(["GresTypes=gpu"] if self.gpus else []),
                f"SlurmctldHost={self.host}(127.0.0.1)",
                f"SlurmctldPort={port_for_later()}",
                f"SlurmdPort={port_for_later()}",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={self.munge_socket}",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"StateSaveLocation={r / 'state'}",
                f"SlurmdSpoolDir={r / 'spool'}",
                f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                f"SlurmdPidFile={r / 'slurmd.pid'}",
                f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                # No cgroups, accounting or MPI: nothing a container without systemd lacks.
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "MpiDefault=none",
                "SchedulerType=sched/builtin",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "ReturnToService=2",
                "MailProg=/bin/true",
                "KillWait=10",
                f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1}"
                + (f" Gres=gpu:{self.gpus}" if self.gpus else "")
                + " State=UNKNOWN",
                f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )

    def _daemon(self, name: str, argv: list[str]) -> None:
        with open(self.root / f"{name}.out", "w") as out:  # the daemon keeps its own copy of the file
            self.procs.append(
                subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
                )
            )

    def _node_idle(self) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[0]} exited: {self.logs()}")
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], check=False, capture_output=True, text=True, env=self.env
        )
        return out.returncode == 0 and out.stdout.strip() == "idle"

    @staticmethod
    def _wait(predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    def logs(self) -> str:
        parts = []
        for f in [*sorted(self.root.glob("*.out")), *sorted((self.root / "log").glob("*.log"))]:
            parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def stop(self) -> None:
        subprocess.run(
            ["scancel", "--full", "--user=root"], env=self.env, check=False, capture_output=True, timeout=30
        )
        # Let slurmd end the jobs' steps before it stops: stopped first, it leaves their services running
        # (a failed test's job outlived the cluster that way).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.procs and self.procs[-1].poll() is None:
            queue = subprocess.run(["squeue", "-h"], env=self.env, check=False, capture_output=True,
                                   text=True, timeout=30)
            if queue.returncode != 0 or not queue.stdout.strip():
                break
            time.sleep(0.5)
        for proc in reversed(self.procs):  # slurmd, slurmctld, munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    # -- jobs ----------------------------------------------------------------------------------
    def sbatch(self, args: list[str], env: dict[str, str], cwd: Path) -> str:
        proc = subprocess.run(
            ["sbatch", "--parsable", *args],
            check=False,
            capture_output=True,
            text=True,
            env={**self.env, **env},
            cwd=cwd,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id],
            check=False,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return dict(re.findall(r"(\w+)=(\S*)", out.stdout))

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """The job's record once it has ended (COMPLETED, FAILED, …)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info["JobState"] not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return info
            time.sleep(0.5)
        subprocess.run(["scancel", job_id], env=self.env, check=False, capture_output=True, timeout=30)
        raise AssertionError(f"job {job_id} still {info['JobState']} after {timeout:.0f}s")
