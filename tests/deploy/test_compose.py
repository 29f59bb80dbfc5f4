"""deploy/compose.yaml: valid Compose, and every command in it a valid rlfleet command.

Docker Compose v2 loads the files (env files, interpolation, profiles, the CPU override) and
checks them against the Compose schema; jsonschema checks them against the same schema taken
from that binary. Each container's command (after the image's entrypoint, `rlfleet`) then goes
through rlfleet's own argument parser and config loader, with the job file it would mount.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import jsonschema
import pytest
import yaml

from tests.deploy.cli_args import load_job, parse_cli
from tests.deploy.compose_tool import DEPLOY, REPO, compose_config, compose_schema
from tests.deploy.dockerfile_context import entrypoint, instructions

pytestmark = pytest.mark.unit

COMPOSE = DEPLOY / "compose.yaml"
CPU_OVERRIDE = DEPLOY / "compose.cpu.yaml"
ENV_FILE = DEPLOY / "compose.env"
ROLES = ("rollout", "reward", "learner", "controller")
SERVICES = ("rollout", "reward", "learner")


@pytest.fixture(scope="module")
def default_config() -> dict:
    return compose_config(COMPOSE, env_file=ENV_FILE)


def _env_variant(tmp_path: Path, **changes: str) -> Path:
    """The shipped env file with some values changed."""
    lines = ENV_FILE.read_text().splitlines()
    out = [
        f"{ln.split('=', 1)[0]}={changes.pop(ln.split('=', 1)[0])}"
        if "=" in ln and not ln.startswith("#") and ln.split("=", 1)[0] in changes
        else ln
        for ln in lines
    ]
    assert not changes, f"not in {ENV_FILE.name}: {sorted(changes)}"
    path = tmp_path / "variant.env"
    path.write_text("\n".join(out) + "\n")
    return path


def _host_path(service: dict, container_path: str) -> Path:
    """The checkout file a container path comes from, through the service's bind mounts."""
    target = PurePosixPath(container_path)
    for mount in service.get("volumes", []):
        mount_target = PurePosixPath(mount["target"])
        if mount["type"] == "bind" and (target == mount_target or mount_target in target.parents):
            return Path(mount["source"]) / target.relative_to(mount_target)
    raise AssertionError(f"{container_path} is not mounted into the container")


def _rlfleet_argv(service: dict) -> list[str]:
    """The image's entrypoint is `tini -- rlfleet`: a container's command is rlfleet's arguments."""
    assert entrypoint()[-1] == "rlfleet"
    assert service.get("entrypoint") is None, "a service replaced the image's entrypoint"
    return service["command"]


def _jobs(config: dict) -> dict:
    """role -> (parsed arguments, loaded job config) for each rlfleet container."""
    jobs = {}
    for role in ROLES:
        service = config["services"][role]
        args = parse_cli(_rlfleet_argv(service))
        jobs[role] = (args, load_job(args, _host_path(service, args.config)))
    return jobs


def test_compose_files_follow_the_compose_schema(default_config):
    validator = jsonschema.Draft7Validator(compose_schema())
    raw = yaml.safe_load(COMPOSE.read_text())
    loaded = {
        "compose.yaml as written": raw,
        "compose.yaml with compose.env": default_config,
        "+ monitoring profile": compose_config(COMPOSE, env_file=ENV_FILE, profiles=("monitoring",)),
        "+ compose.cpu.yaml": compose_config(COMPOSE, CPU_OVERRIDE, env_file=ENV_FILE),
    }
    for what, doc in loaded.items():
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, f"{what}: {errors}"


def test_the_schema_check_catches_a_misspelt_key():
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["learner"]["healthchek"] = broken["services"]["learner"].pop("healthcheck")
    assert list(jsonschema.Draft7Validator(compose_schema()).iter_errors(broken))


@pytest.mark.parametrize("variant", ["shipped", "gsm8k"])
def test_every_command_parses_with_the_cli_and_config(tmp_path, variant):
    env_file = (
        ENV_FILE
        if variant == "shipped"
        else _env_variant(tmp_path, RLFLEET_CONFIG="/etc/rlfleet/configs/gsm8k-qwen2.5-0.5b.yaml")
    )
    config = compose_config(COMPOSE, env_file=env_file)
    jobs = _jobs(config)
    assert [jobs[r][0].command for r in ROLES] == ["serve", "serve", "serve", "controller"]
    assert [jobs[r][0].role for r in SERVICES] == list(SERVICES)
    if variant == "gsm8k":
        assert jobs["learner"][1].model.path == "/models/Qwen2.5-0.5B-Instruct"
        # Relative data paths resolve in the image's working directory to the checkout's data/.
        workdir = [c.value[0] for c in instructions() if c.cmd == "WORKDIR"][-1]
        controller = config["services"]["controller"]
        for f in [*jobs["controller"][1].data.train_files, *jobs["controller"][1].data.val_files]:
            assert _host_path(controller, str(PurePosixPath(workdir) / f)) == REPO / f
    # One run folder for all four, on the volume they share.
    run_dirs = {PurePosixPath(cfg.run.dir) for _, cfg in jobs.values()}
    assert len(run_dirs) == 1, run_dirs
    assert run_dirs.pop().is_relative_to("/data")
    for role in ROLES:
        volumes = {v["target"]: v for v in config["services"][role]["volumes"]}
        assert volumes["/data"]["type"] == "volume" and volumes["/data"]["source"] == "rlfleet-data"


def test_services_bind_their_own_names_and_the_controller_finds_them(default_config):
    jobs = _jobs(default_config)
    for role in ("reward", "learner", "controller"):
        service = default_config["services"][role]
        endpoint = getattr(jobs[role][1], role)
        # The host is the container's own name: other containers reach it there, and for the
        # learner it is also the weight-sync address the rollout joins.
        assert endpoint.host == service["hostname"] == role
        assert endpoint.port > 0 and endpoint.metrics_port > 0
    controller = jobs["controller"][1]
    for role in ("reward", "learner"):
        assert getattr(controller, role).address == f"{role}:{getattr(jobs[role][1], role).port}"


def test_the_rollout_service_scales_and_its_containers_join_the_controller(default_config):
    """`--scale rollout=N`: no fixed hostname (each container has its own address, which it gives the
    controller when it joins), and the controller takes whoever joins rather than one address."""
    rollout_args, rollout = _jobs(default_config)["rollout"]
    controller = _jobs(default_config)["controller"][1]
    service = default_config["services"]["rollout"]
    assert "hostname" not in service and "container_name" not in service
    assert rollout_args.join == f"controller:{controller.controller.port}"
    assert rollout.rollout.host == "0.0.0.0" and rollout.rollout.port > 0
    assert controller.rollout.address is None and controller.rollout.addresses == []
    # a scale-down's SIGTERM leaves time to hand the groups back (the controller waits 60 s at most)
    assert service["stop_grace_period"] == "2m0s"  # as docker compose config normalises 120s


def test_health_checks_ask_each_service_itself(default_config):
    jobs = _jobs(default_config)
    for role in ROLES:
        check = default_config["services"][role]["healthcheck"]
        assert check["test"][0] == "CMD"
        assert check["test"][1] == "rlfleet"
        args = parse_cli(check["test"][2:])
        endpoint = getattr(jobs[role][1], role)
        host = "127.0.0.1" if endpoint.host == "0.0.0.0" else endpoint.host  # a wildcard bind answers locally
        assert args.command == "health" and args.address == f"{host}:{endpoint.port}"
        assert args.config == jobs[role][0].config  # the job's TLS settings, if it has any


def test_gpus_restarts_and_start_order(default_config):
    services = default_config["services"]

    def gpus(role: str) -> list[str]:
        devices = (
            services[role].get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        )
        return [i for d in devices if "gpu" in d["capabilities"] for i in d["device_ids"]]

    assert gpus("rollout") and gpus("learner")
    assert not set(gpus("rollout")) & set(gpus("learner")), "the rollout and the learner share a GPU"
    assert not gpus("controller") and not gpus("reward")
    for role in SERVICES:
        assert services[role]["restart"] == "unless-stopped"
    assert services["controller"]["restart"] == "no"  # it does not resume a run
    depends = services["controller"]["depends_on"]
    assert {role: depends[role]["condition"] for role in depends} == dict.fromkeys(
        ("reward", "learner"), "service_healthy"
    )
    # rollout containers join the controller: it must be up (they retry while it starts)
    assert services["rollout"]["depends_on"]["controller"]["condition"] == "service_started"


def test_monitoring_profile_scrapes_every_service_and_shows_the_dashboard():
    plain = compose_config(COMPOSE, env_file=ENV_FILE)
    assert not {"prometheus", "grafana"} & set(plain["services"]), "monitoring must be opt-in"
    config = compose_config(COMPOSE, env_file=ENV_FILE, profiles=("monitoring",))
    jobs = _jobs(config)
    expected = {f"{role}:{getattr(jobs[role][1], role).metrics_port}": role for role in ROLES}

    prometheus = config["services"]["prometheus"]
    prom_cfg = yaml.safe_load(_host_path(prometheus, "/etc/prometheus/prometheus.yml").read_text())
    scraped = {
        target: group.get("labels", {}).get("name")
        for job in prom_cfg["scrape_configs"]
        for group in job.get("static_configs", [])
        for target in group["targets"]
    }
    # the scaled rollout containers: every address the service's name resolves to
    for job in prom_cfg["scrape_configs"]:
        for lookup in job.get("dns_sd_configs", []):
            assert lookup["type"] == "A"
            names = {relabel["replacement"] for relabel in job["relabel_configs"]
                     if relabel["target_label"] == "name"}
            scraped.update({f"{n}:{lookup['port']}": names.pop() for n in lookup["names"]})
    assert scraped == expected

    grafana = config["services"]["grafana"]
    datasources = yaml.safe_load(
        _host_path(grafana, "/etc/grafana/provisioning/datasources/prometheus.yaml").read_text()
    )["datasources"]
    assert [d["url"] for d in datasources if d["type"] == "prometheus"] == ["http://prometheus:9090"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    providers = yaml.safe_load(
        _host_path(grafana, "/etc/grafana/provisioning/dashboards/rlfleet.yaml").read_text()
    )["providers"]
    dashboards = list(_host_path(grafana, providers[0]["options"]["path"]).glob("*.json"))
    assert dashboards, "no dashboard where Grafana's provider looks"
    assert all(json.loads(d.read_text())["panels"] for d in dashboards)
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_path(grafana, home).is_file()


def test_cpu_override_drops_gpus_and_builds_the_cpu_image():
    config = compose_config(COMPOSE, CPU_OVERRIDE, env_file=ENV_FILE)
    for role in ROLES:
        service = config["services"][role]
        assert not service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
        assert service["image"] == "rlfleet:cpu"
        assert service["build"]["args"]["DEVICE"] == "cpu"
        assert (REPO / service["build"]["context"]).resolve() == REPO
    _jobs(config)  # the commands are untouched and still parse


def test_the_env_profile_serves_the_jobs_environment_where_the_job_points(tmp_path):
    """`--profile env` adds an environment server that serves env.name of the job file, with its
    security (`--config`), at the address the job's env.address gives the rollout and controller."""
    plain = compose_config(COMPOSE, env_file=ENV_FILE)
    assert "env" not in plain["services"], "the environment server must be opt-in"
    env_file = _env_variant(tmp_path, RLFLEET_CONFIG="/etc/rlfleet/job-env.yaml")
    config = compose_config(COMPOSE, env_file=env_file, profiles=("env",))
    errors = list(jsonschema.Draft7Validator(compose_schema()).iter_errors(config))
    assert not errors, errors
    service = config["services"]["env"]
    args = parse_cli(_rlfleet_argv(service))
    job = load_job(args, _host_path(service, args.config))
    assert (args.command, args.env_command, args.environment) == ("env", "serve", None)  # env.name of the job
    assert job.env.name == "digits_game"
    assert f"{args.host}:{args.port}" == job.env.address == f"{service['hostname']}:{args.port}"
    check = parse_cli(service["healthcheck"]["test"][2:])
    assert check.command == "health" and check.address == job.env.address and check.config == args.config
    jobs = _jobs(config)
    for role in ("rollout", "controller"):  # they reach it where it serves
        assert jobs[role][1].env.address == job.env.address
    assert not service.get("deploy"), "the environment server takes no GPU"
    cpu = compose_config(COMPOSE, CPU_OVERRIDE, env_file=env_file, profiles=("env",))
    assert cpu["services"]["env"]["image"] == "rlfleet:cpu"
