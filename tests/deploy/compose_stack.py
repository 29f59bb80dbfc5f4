"""A compose project of deploy/compose.yaml + compose.cpu.yaml run through podman's Docker API, for
the `containers` tests (test_compose_run.py, test_compose_scale.py).

What it adds to the shipped files (an override of its own): the job files of the test (mounted at
/etc/rlfleet/test/), ulimits no higher than this host's hard limits (root here lacks
CAP_SYS_RESOURCE), and a private /etc/hosts for `rlfleet status` (the host does not resolve the
compose network's names).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

from tests.deploy.compose_tool import DEPLOY, compose_binary
from tests.deploy.podman_host import DockerApi, built_tiny_models, can_raise_limits, hard_limits, podman, run

ROLES = ("rollout", "reward", "learner", "controller")
STEPS = 40  # deploy/compose/job.yaml's controller.max_steps
MORE_STEPS = 3
RUN_NAME = "compose"


class Stack:
    def __init__(self, folder: Path, api: DockerApi, image: str, steps: int = STEPS):
        """`steps`: controller.max_steps of the first job (the resumed one trains MORE_STEPS beyond
        the shipped job's STEPS)."""
        self.folder = folder
        self.project = f"rlfleet-test-{uuid.uuid4().hex[:8]}"
        self.api = api
        jobs = folder / "jobs"
        jobs.mkdir()
        # The shipped job (deploy/compose/job.yaml: the embedded default) with fewer steps.
        shipped = yaml.safe_load((DEPLOY / "compose" / "job.yaml").read_text())
        assert shipped["controller"]["max_steps"] == STEPS
        first = {**shipped, "controller": {**shipped["controller"], "max_steps": steps}}
        (jobs / "first.yaml").write_text(yaml.safe_dump(first))
        resume = {**shipped, "controller": {"max_steps": STEPS + MORE_STEPS, "resume": "latest"},
                  "learner": {"resume_from": "latest"}}
        (jobs / "resume.yaml").write_text(yaml.safe_dump(resume))
        (folder / "models").mkdir()
        (folder / "data").mkdir()
        service: dict = {"volumes": [f"{jobs}:/etc/rlfleet/test:ro"]}
        if not can_raise_limits():
            limits = hard_limits(api.proc.pid)
            service["ulimits"] = {k: limits[k] for k in ("nofile", "memlock", "nproc") if limits[k] != -1}
        self.override = folder / "compose.test.yaml"
        self.override.write_text(yaml.safe_dump({"services": {role: service for role in ROLES}}))
        self.env = {
            "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
            "DOCKER_HOST": api.url, "RLFLEET_CPU_IMAGE": image,
            "RLFLEET_MODELS_DIR": str(folder / "models"), "RLFLEET_DATA_DIR": str(folder / "data"),
            "RLFLEET_LOAD_TIMEOUT": "8m",
        }

    def compose(self, *args: str, job: str = "first", timeout: float = 600) -> subprocess.CompletedProcess:
        files = [DEPLOY / "compose.yaml", DEPLOY / "compose.cpu.yaml", self.override]
        argv = [str(compose_binary()), "-p", self.project, "--env-file", str(DEPLOY / "compose.env")]
        for f in files:
            argv += ["-f", str(f)]
        env = {**self.env, "RLFLEET_CONFIG": f"/etc/rlfleet/test/{job}.yaml"}
        return run([*argv, *args], timeout=timeout, env=env)

    def seed_cache(self) -> None:
        """The host's built tiny models into the volume's /data/cache (owned by the image's user)."""
        cache = self.run_dir.parents[1] / "cache"
        for model in built_tiny_models():
            shutil.copytree(model, cache / model.name, dirs_exist_ok=True)
        run(["chown", "-R", "1000:1000", str(cache)])

    def container(self, role: str, index: int = 1) -> str:
        """The container of `role`; a scaled service has one per `index` (1, 2, …)."""
        return f"{self.project}-{role}-{index}"

    def inspect(self, role: str, fmt: str, index: int = 1) -> str:
        return podman("inspect", "--format", fmt, self.container(role, index), check=False).stdout.strip()

    @property
    def run_dir(self) -> Path:
        volume = podman("volume", "inspect", "--format", "{{.Mountpoint}}", f"{self.project}_rlfleet-data")
        return Path(volume.stdout.strip()) / "outputs" / RUN_NAME

    def steps(self) -> list[int]:
        try:
            lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        except OSError:
            return []
        return [json.loads(line)["step"] for line in lines if line.strip()]

    def logs(self) -> str:
        out = []
        for role in ROLES:
            logs = podman("logs", "--tail", "15", self.container(role), check=False)
            out.append(f"--- {role}\n{logs.stdout}{logs.stderr}")
        return "\n".join(out)

    def status_from_host(self) -> subprocess.CompletedProcess:
        """`rlfleet status RUN_DIR` on the host, with the containers' names in a private /etc/hosts."""
        hosts = self.folder / "hosts"
        lines = [Path("/etc/hosts").read_text()]
        for role in ROLES:
            ip = self.inspect(role, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
            lines.append(f"{ip} {role}\n")
        hosts.write_text("".join(lines))
        rlfleet = str(Path(sys.executable).parent / "rlfleet")
        return run(["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
                    str(hosts), rlfleet, "status", "--json", str(self.run_dir)], timeout=60, check=False)
