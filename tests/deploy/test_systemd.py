"""deploy/systemd: template units that systemd accepts, whose command lines are rlfleet commands.

`systemd-analyze verify` checks the units (syntax, every key and value, dependencies, that the
commands exist). Their ExecStart/ExecStartPost lines, expanded with the example environment file
the way systemd expands them, go through rlfleet's parser and config loader; the e2e test runs
those expanded commands for real, in the order systemd would start them (there is no systemd
running here to start the units themselves).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.rpc.service_main import LOAD_FAILED_EXIT
from tests.deploy.cli_args import load_job, parse_cli
from tests.free_ports import port_for_later
from tests.deploy.systemd_units import (
    UNITS,
    command,
    install_copies,
    read_env_file,
    read_unit,
    unit_env,
    values,
    verify,
)

ENV_FILE = UNITS / "rlfleet.env"
SERVICES = ("rollout", "reward", "learner")
ROLES = (*SERVICES, "controller")
RLFLEET_BIN = str(Path(sys.executable).parent / "rlfleet")


def _unit(role: str) -> Path:
    return UNITS / f"rlfleet-{role}@.service"


def _instances(instance: str) -> list[str]:
    return [f"rlfleet-{role}@{instance}.service" for role in ROLES] + [f"rlfleet@{instance}.target"]


@pytest.mark.unit
def test_systemd_analyze_verify_accepts_every_unit(tmp_path):
    install_copies(tmp_path, RLFLEET_BIN)
    proc = verify(tmp_path, [*_instances("gsm8k"), "rlfleet-env@gsm8k.service"])
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


@pytest.mark.unit
def test_systemd_analyze_verify_reports_a_broken_unit(tmp_path):
    """The check above is not vacuous: verify prints what is wrong (and still exits 0)."""
    (copy,) = [c for c in install_copies(tmp_path, RLFLEET_BIN) if c.name == "rlfleet-reward@.service"]
    copy.write_text(
        copy.read_text()
        .replace("Restart=on-failure", "Restart=sometimes")
        .replace("KillMode=mixed", "KilMode=mixed")
    )
    out = verify(tmp_path, ["rlfleet-reward@x.service"])
    assert "sometimes" in out.stderr and "KilMode" in out.stderr, out.stderr


def _env(**changes: str) -> dict[str, str]:
    env = read_env_file(ENV_FILE)
    unknown = set(changes) - set(env)
    assert not unknown, f"not in {ENV_FILE.name}: {sorted(unknown)}"
    return {**env, **changes}


@pytest.mark.unit
@pytest.mark.parametrize("config", ["empty", "gsm8k"])
def test_commands_parse_with_the_cli_and_config(tmp_path, config):
    if config == "empty":  # the shipped env file's job: an empty YAML file is the embedded default
        job = tmp_path / "job.yaml"
        job.write_text("")
    else:
        job = Path(__file__).resolve().parents[2] / "deploy" / "configs" / "gsm8k-qwen2.5-0.5b.yaml"
    env = _env(RLFLEET_CONFIG=str(job))
    jobs = {}
    for role in ROLES:
        args = parse_cli(command(_unit(role), "ExecStart", "gsm8k", env)[1:])
        assert args.command == ("controller" if role == "controller" else "serve")
        cfg = load_job(args)
        assert (cfg.run.name, cfg.run.output_dir) == (env["RLFLEET_RUN_NAME"], env["RLFLEET_OUTPUT_DIR"])
        jobs[role] = (args, cfg)
    for role in SERVICES:
        args, cfg = jobs[role]
        endpoint = getattr(cfg, role)
        assert args.role == role
        assert (endpoint.host, endpoint.port, endpoint.metrics_port) == (
            env["RLFLEET_HOST"],
            int(env[f"RLFLEET_{role.upper()}_PORT"]),
            int(env[f"RLFLEET_{role.upper()}_METRICS_PORT"]),
        )
        # ExecStartPost waits for this very service to say SERVING.
        post = parse_cli(command(_unit(role), "ExecStartPost", "gsm8k", {**env, "MAINPID": "4321"})[1:])
        assert post.command == "health" and post.address == f"{endpoint.host}:{endpoint.port}"
        assert post.pid == 4321  # systemd's $MAINPID: the wait ends if the service dies loading
        assert post.wait == float(env["RLFLEET_LOAD_TIMEOUT_S"]) and post.config == env["RLFLEET_CONFIG"]
        # The example env file is one coherent single-host job: the controller finds each service.
        assert getattr(jobs["controller"][1], role).address == f"{endpoint.host}:{endpoint.port}"
    rollout_args, _ = jobs["rollout"]
    assert (rollout_args.name, rollout_args.index) == (
        env["RLFLEET_ROLLOUT_NAME"],
        int(env["RLFLEET_ROLLOUT_INDEX"]),
    )
    assert len({str(cfg.run.dir) for _, cfg in jobs.values()}) == 1


@pytest.mark.unit
def test_override_variables_split_into_arguments(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("")
    env = _env(
        RLFLEET_CONFIG=str(job),
        RLFLEET_ARGS="controller.max_staleness=0 algorithm.kl_coef=0.01",
        RLFLEET_LEARNER_ARGS="learner.lr=1e-5",
        RLFLEET_CONTROLLER_ARGS="rollout.addresses=[h2:50051,h3:50051]",
    )
    learner = load_job(parse_cli(command(_unit("learner"), "ExecStart", "j", env)[1:]))
    controller = load_job(parse_cli(command(_unit("controller"), "ExecStart", "j", env)[1:]))
    assert learner.learner.lr == 1e-5 and learner.controller.max_staleness == 0
    assert learner.algorithm.kl_coef == 0.01
    assert controller.rollout.addresses == ["h2:50051", "h3:50051"] and controller.learner.lr != 1e-5


@pytest.mark.unit
def test_restart_policies_ordering_and_the_target():
    target = read_unit(UNITS / "rlfleet@.target")
    wanted = " ".join(values(target, "Unit", "Wants")).split()
    assert sorted(wanted) == sorted(f"rlfleet-{role}@%i.service" for role in ROLES)
    for role in ROLES:
        unit = read_unit(_unit(role))
        assert values(unit, "Service", "EnvironmentFile") == ["/etc/rlfleet/%i.env"]
        assert values(unit, "Unit", "PartOf") == ["rlfleet@%i.target"]
        assert values(unit, "Install", "WantedBy") == ["rlfleet@%i.target"]
        assert values(unit, "Service", "KillMode") == ["mixed"]  # SIGTERM to rlfleet, which drains
        if role in SERVICES:
            assert values(unit, "Service", "Restart") == ["on-failure"]
            assert values(unit, "Service", "RestartPreventExitStatus") == [str(LOAD_FAILED_EXIT)]  # no retry
            assert values(unit, "Service", "ExecStartPost"), (
                "units ordered after it would not wait for SERVING"
            )
    controller = read_unit(_unit("controller"))
    after = " ".join(values(controller, "Unit", "After")).split()
    assert {f"rlfleet-{role}@%i.service" for role in SERVICES} <= set(after)
    assert values(controller, "Service", "Restart") == ["no"]  # it does not resume a run
    # SIGTERM stops it cleanly with 128+15 (rlfleet/app/interrupt.py): `systemctl stop` is not a failure.
    assert values(controller, "Service", "SuccessExitStatus") == ["143"]


def _tail(folder: Path, role: str) -> str:
    return (folder / f"{role}.err").read_text(errors="replace")[-2000:]


@pytest.mark.e2e
@pytest.mark.slow
def test_the_units_commands_run_a_job_in_systemd_order(tmp_path):
    """ExecStart of each service, then its ExecStartPost (which must see SERVING), then the
    controller's ExecStart; then SIGTERM to each service's main process, as KillMode=mixed sends.
    Differences from a real systemd start: the user (not `rlfleet`), the working directory and
    RLFLEET_CACHE/HF_HOME (the test environment's, where the tiny model is already built) and
    the rlfleet path (this checkout's, not /opt/rlfleet)."""
    job = tmp_path / "job.yaml"
    job.write_text("")
    ports = {
        f"RLFLEET_{r.upper()}_{kind}": str(port_for_later())
        for r in ROLES for kind in ("PORT", "METRICS_PORT")
    }
    env_file = {
        **_env(
            RLFLEET_CONFIG=str(job),
            RLFLEET_OUTPUT_DIR=str(tmp_path / "outputs"),
            RLFLEET_LOAD_TIMEOUT_S="240",
            RLFLEET_ARGS="controller.max_steps=2",
            **ports,
        ),
        **{
            f"RLFLEET_{r.upper()}_ADDRESS": f"127.0.0.1:{ports[f'RLFLEET_{r.upper()}_PORT']}"
            for r in SERVICES
        },
    }
    keep = {k: os.environ[k] for k in ("RLFLEET_CACHE", "HF_HOME") if k in os.environ}
    services: dict[str, subprocess.Popen] = {}

    def environment(role: str) -> dict[str, str]:
        env = {**os.environ, **unit_env(_unit(role), "job", env_file)}
        for key in ("RLFLEET_CACHE", "HF_HOME"):
            env.pop(key, None)
        return {**env, **keep}

    def argv(role: str, key: str) -> list[str]:
        # systemd gives ExecStartPost the main process's pid as $MAINPID.
        main_pid = {"MAINPID": str(services[role].pid)} if role in services else {}
        return [RLFLEET_BIN, *command(_unit(role), key, "job", {**env_file, **main_pid})[1:]]

    try:
        for role in SERVICES:
            with open(tmp_path / f"{role}.err", "w") as err:
                services[role] = subprocess.Popen(
                    argv(role, "ExecStart"),
                    env=environment(role),
                    cwd=tmp_path,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                )
        for role in SERVICES:
            post = subprocess.run(
                argv(role, "ExecStartPost"),
                env=environment(role),
                check=False,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert post.returncode == 0, f"{role} never became SERVING: {post.stdout}{_tail(tmp_path, role)}"
        controller = subprocess.run(
            argv("controller", "ExecStart"),
            env=environment("controller"),
            cwd=tmp_path,
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert controller.returncode == 0, controller.stderr[-3000:]
        run_dir = tmp_path / "outputs" / env_file["RLFLEET_RUN_NAME"]
        steps = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        assert len(steps) == 2
        assert {p.stem for p in (run_dir / "services").glob("*.json")} == set(ROLES)
        for role, proc in services.items():
            proc.send_signal(signal.SIGTERM)
        for role, proc in services.items():
            assert proc.wait(timeout=60) == 0, f"{role} did not stop cleanly: {_tail(tmp_path, role)}"
    finally:
        for proc in services.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


JOIN_UNIT = UNITS / "rlfleet-rollout-join@.service"


@pytest.mark.unit
def test_the_joining_replica_unit_verifies_and_joins_the_controller(tmp_path):
    """rlfleet-rollout-join@JOB: a rollout replica on an added host that joins the job's controller."""
    install_copies(tmp_path, RLFLEET_BIN)
    proc = verify(tmp_path, ["rlfleet-rollout-join@gsm8k.service"])
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr
    job = tmp_path / "job.yaml"
    job.write_text("")
    env = _env(RLFLEET_CONFIG=str(job), RLFLEET_JOIN_CONTROLLER="head:50050", RLFLEET_HOST="node7")
    args = parse_cli(command(JOIN_UNIT, "ExecStart", "gsm8k", env)[1:])
    cfg = load_job(args)
    assert (args.command, args.role, args.join) == ("serve", "rollout", "head:50050")
    assert (cfg.rollout.host, cfg.rollout.port) == ("node7", 0)  # a free port: it tells the controller
    assert (cfg.run.name, cfg.run.output_dir) == (env["RLFLEET_RUN_NAME"], env["RLFLEET_OUTPUT_DIR"])
    unit = read_unit(JOIN_UNIT)
    assert values(unit, "Service", "EnvironmentFile") == ["/etc/rlfleet/%i.env"]  # the job's own file
    assert values(unit, "Service", "Restart") == ["on-failure"]
    # refused (token, model) or a load that would fail again: not restarted
    assert values(unit, "Service", "RestartPreventExitStatus") == [str(LOAD_FAILED_EXIT)]
    assert values(unit, "Service", "KillMode") == ["mixed"]  # SIGTERM to rlfleet, which leaves the run
    assert int(values(unit, "Service", "TimeoutStopSec")[0].rstrip("s")) > 60  # the leave's 60 s drain
    assert not values(unit, "Unit", "PartOf")  # not a part of the job's target: it comes and goes alone


ENV_UNIT = UNITS / "rlfleet-env@.service"


def _env_job(tmp_path: Path) -> tuple[dict[str, str], Path]:
    env = _env()
    job = tmp_path / "job.yaml"
    address = f"{env['RLFLEET_HOST']}:{env['RLFLEET_ENV_PORT']}"
    job.write_text(f"env: {{name: digits_game, address: '{address}'}}\n")
    return _env(RLFLEET_CONFIG=str(job)), job


@pytest.mark.unit
def test_the_environment_server_unit_serves_the_jobs_environment_where_it_points(tmp_path):
    """rlfleet-env@JOB: env.name of the job file, with its security (--config), at the address the
    job's env.address gives the rollout services; part of the job's target only once enabled."""
    env, job = _env_job(tmp_path)
    args = parse_cli(command(ENV_UNIT, "ExecStart", "game", env)[1:])
    cfg = load_job(args)
    assert (args.command, args.env_command, args.environment, args.config) == ("env", "serve", None, str(job))
    assert cfg.env.name == "digits_game"
    assert f"{args.host}:{args.port}" == cfg.env.address == f"{env['RLFLEET_HOST']}:{env['RLFLEET_ENV_PORT']}"
    post = parse_cli(command(ENV_UNIT, "ExecStartPost", "game", env)[1:])
    assert post.command == "health" and post.address == cfg.env.address and post.config == str(job)
    unit = read_unit(ENV_UNIT)
    assert values(unit, "Service", "EnvironmentFile") == ["/etc/rlfleet/%i.env"]
    assert values(unit, "Unit", "PartOf") == ["rlfleet@%i.target"]
    assert values(unit, "Install", "WantedBy") == ["rlfleet@%i.target"]  # `systemctl enable` adds it
    target_wants = " ".join(values(read_unit(UNITS / "rlfleet@.target"), "Unit", "Wants"))
    assert "rlfleet-env@%i.service" not in target_wants  # a job without an environment has none
    assert values(unit, "Service", "Restart") == ["on-failure"]
    assert values(unit, "Service", "KillMode") == ["mixed"]
    assert "rlfleet-env@%i.service" in " ".join(values(read_unit(_unit("controller")), "Unit", "After"))


@pytest.mark.e2e
def test_the_environment_server_units_commands_serve_and_stop(tmp_path):
    """ExecStart of rlfleet-env@, then its ExecStartPost (which must see SERVING), then SIGTERM."""
    env, _ = _env_job(tmp_path)
    env = {**env, "RLFLEET_ENV_PORT": str(port_for_later()), "RLFLEET_LOAD_TIMEOUT_S": "60"}
    argv = {key: [RLFLEET_BIN, *command(ENV_UNIT, key, "game", env)[1:]]
            for key in ("ExecStart", "ExecStartPost")}
    unit_environment = {**os.environ, **unit_env(ENV_UNIT, "game", env)}
    with open(tmp_path / "env.err", "w") as err:
        server = subprocess.Popen(argv["ExecStart"], env=unit_environment, cwd=tmp_path,
                                  stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        post = subprocess.run(argv["ExecStartPost"], env=unit_environment, check=False, capture_output=True,
                              text=True, timeout=120)
        assert post.returncode == 0, f"never SERVING: {post.stdout}{_tail(tmp_path, 'env')}"
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0, _tail(tmp_path, "env")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
