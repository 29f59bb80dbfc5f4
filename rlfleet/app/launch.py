"""`rlfleet run`: every service as its own OS process, then the controller.

Each service binds a free port itself and announces it in
`<run_dir>/services/<role>.json`, so there is no port race. A child that dies
stops the whole run with a message naming it; Ctrl-C stops everything cleanly,
after the controller checkpointed the last finished step (STOP_GRACE_S at most).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfleet.app.interrupt import StopOnSignal
from rlfleet.app.progress import StepProgress
from rlfleet.app.run_end import FAILED, FINISHED, STOPPED, clear_end, record_end
from rlfleet.app.serve import ROLES
from rlfleet.app.supervisor import Supervisor
from rlfleet.checkpoint_files import VERDICTS_ENV, DigestChecks
from rlfleet.config import JobConfig
from rlfleet.cpu_threads import share_of_cores
from rlfleet.errors import RlfleetError, ServiceUnavailable
from rlfleet.rpc.service_main import LOAD_FAILED_EXIT, PARENT_PID_ENV, read_load_error


@dataclass
class Child:
    role: str
    proc: subprocess.Popen
    stderr_path: Path
    expected_exit: bool = field(default=False)
    cmd: list[str] = field(default_factory=list)  # to restart it (rlfleet/app/supervisor.py)
    env: dict[str, str] | None = None
    run_dir: Path | None = None  # where it writes its one-line error if it fails while loading

    def load_error(self) -> str | None:
        """Its own one-line error if it failed while loading for a reason a restart would repeat."""
        if self.run_dir is None or self.proc.returncode != LOAD_FAILED_EXIT:
            return None
        return read_load_error(self.run_dir, self.role)

    def describe_exit(self) -> str:
        load_error = self.load_error()
        if load_error:  # the service's own words, not whatever line its stderr happened to end with
            return (f"the {self.role} service (pid {self.proc.pid}) failed while loading: {load_error} "
                    f"(full output: {self.stderr_path})")
        code = self.proc.returncode
        if code is not None and code < 0:
            # Killed from outside (kill -9, the OOM killer): its last stderr line says nothing about why.
            try:
                name = f" ({signal.Signals(-code).name})"
            except ValueError:
                name = ""
            return (f"the {self.role} service (pid {self.proc.pid}) was killed by signal {-code}{name}; "
                    f"its log: {self.stderr_path}")
        tail = ""
        try:
            lines = [ln for ln in self.stderr_path.read_text(errors="replace").splitlines() if ln.strip()]
            tail = f": {lines[-1].strip()}" if lines else ""
        except OSError:
            pass
        return (f"the {self.role} service (pid {self.proc.pid}) exited with code "
                f"{self.proc.returncode}{tail} "
                f"(full output: {self.stderr_path})")


# After Ctrl-C/SIGTERM the services stay up while the controller finishes its step and checkpoints
# it (controller/loop.py); this long at most, should the controller be stuck in a call. A 7B model's
# checkpoint (weights and Adam state, ~70 GB, written then hashed) takes about two minutes. A second
# Ctrl-C stops everything at once.
STOP_GRACE_S = 300.0


def replica_names(count: int) -> list[str]:
    """`rollout` for the first replica (so one replica looks like any other service), then rollout-1…"""
    return ["rollout", *(f"rollout-{i}" for i in range(1, count))]


class Launcher:
    def __init__(self, cfg: JobConfig, checkpoint_verdicts: str | None = None):
        """`checkpoint_verdicts`: DigestChecks.export() of the resume's checks, handed to the learner
        it starts first (not to a restarted one, which checks afresh)."""
        self.cfg = cfg
        self.checkpoint_verdicts = checkpoint_verdicts
        self.run_dir = cfg.run.dir
        self.children: list[Child] = []
        self.failure: str | None = None
        self._external: dict[str, str] = {}  # addresses of services started elsewhere
        self.stop = threading.Event()
        self._shutdown_lock = threading.Lock()

    def _threads(self) -> int:
        # The rollout and the learner are the busy ones; each gets half the cores (rlfleet/cpu_threads.py).
        return self.cfg.run.threads_per_service or share_of_cores()

    def start_services(self) -> dict[str, str]:
        self.spawn_services()
        return self.await_addresses()

    def spawn_services(self) -> None:
        """Starts every local service (they load in parallel) and returns at once; await_addresses()
        then waits for their ports. Addresses of services started elsewhere are kept for it."""
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        services_dir = self.run_dir / "services"
        services_dir.mkdir(parents=True, exist_ok=True)
        for stale in [*services_dir.glob("*.json"), *services_dir.glob("*.load-error")]:
            stale.unlink()
        config_path = self.run_dir / "config.yaml"
        # First: the rollout reads the environment's address from the config.
        if self.cfg.env.name and not self.cfg.env.address:
            config_path.write_text(self.cfg.to_yaml())  # the environment server's security and limits
            self.cfg.env.address = self._start_environment(config_path)
            print(f"rlfleet: environment {self.cfg.env.name}@{self.cfg.env.address}", flush=True)
        config_path.write_text(self.cfg.to_yaml())
        addresses = self._external = {}
        for role in ROLES:
            endpoint = getattr(self.cfg, role)
            if role == "rollout" and (endpoint.address or endpoint.addresses):
                external = [endpoint.address] if endpoint.address else []
                addresses.update(zip(replica_names(len(external) + len(endpoint.addresses)),
                                     external + endpoint.addresses))
                continue
            if endpoint.address:
                addresses[role] = endpoint.address
                continue
            if role == "rollout":
                for index, name in enumerate(replica_names(self.cfg.rollout.replicas)):
                    self._spawn(role, config_path, name, index)
                continue
            self._spawn(role, config_path, role, 0)
        # Watched from the start: one that fails while loading stops the run while others still load.
        threading.Thread(target=self._watch, name="child-watch", daemon=True).start()

    def await_addresses(self) -> dict[str, str]:
        """Every service's address: those started elsewhere, then each local one once it bound its port."""
        addresses = dict(self._external)
        for child in self.children:
            if child.role != "env":
                addresses[child.role] = self._await_announce(child)
        return addresses

    def _spawn(self, role: str, config_path: Path, name: str, index: int) -> None:
        if self.stop.is_set():  # Ctrl-C while starting: start nothing more
            raise RlfleetError("stopping")
        stderr_path = self.run_dir / "logs" / f"{name}.stderr"
        cmd = [sys.executable, "-m", "rlfleet.app.cli", "serve", role, "--name", name, "--index", str(index),
               "--config", str(config_path), f"run.threads_per_service={self._threads()}"]
        if role == "learner" and self.cfg.learner.world_size > 1:  # one process per rank; rank 0 serves gRPC
            cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                        str(self.cfg.learner.world_size), "-m", "rlfleet.app.cli"]
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}  # they stop if we are killed (service_main.py)
        first_env = env
        if role == "learner" and self.checkpoint_verdicts:  # so it reads the checkpoints' digests no more
            first_env = {**env, VERDICTS_ENV: self.checkpoint_verdicts}
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(stderr_path, "w"), env=first_env,
                                start_new_session=True)  # Ctrl-C reaches us only; we stop them
        self.children.append(Child(name, proc, stderr_path, cmd=cmd, env=env, run_dir=self.run_dir))

    def _start_environment(self, config_path: Path) -> str:
        """Serves env.name in a process of its own (supervised like the services), with the job's
        security and limits and env.params from `config_path`. Without env.port the server binds a
        free port itself (a port picked here and closed could be taken before it binds it); its
        command then names that port, so a restarted server is found where the rollout already looks."""
        env = self.cfg.env
        stderr_path = self.run_dir / "logs" / "env.stderr"
        cmd = [sys.executable, "-m", "rlfleet.app.cli", "env", "serve", env.name, "--host", "127.0.0.1",
               "--port", str(env.port or 0), "--config", str(config_path),
               "--announce", str(self.run_dir / "services" / "env.json")]
        child_env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(stderr_path, "w"), env=child_env,
                                start_new_session=True)
        child = Child("env", proc, stderr_path, cmd=cmd, env=child_env, run_dir=self.run_dir)
        self.children.append(child)
        address = self._await_announce(child)
        at = cmd.index("--port") + 1  # a restart binds the port it has (rlfleet/app/supervisor.py)
        child.cmd = [*cmd[:at], address.rpartition(":")[2], *cmd[at + 1:]]
        return address

    def _await_announce(self, child: Child, timeout_s: float = 120.0) -> str:
        path = self.run_dir / "services" / f"{child.role}.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if path.exists():
                return json.loads(path.read_text())["address"]
            if self.stop.is_set():
                raise RlfleetError("stopping")
            if child.proc.poll() is not None:
                raise ServiceUnavailable(child.describe_exit())
            time.sleep(0.1)
        raise ServiceUnavailable(f"the {child.role} service did not bind a port within {timeout_s:.0f}s")

    def _watch(self) -> None:
        supervisor = Supervisor(self.cfg.run.max_restarts, self.run_dir)  # bounded restarts with backoff
        while not self.stop.is_set():
            for child in self.children:
                if child.proc.poll() is not None and not child.expected_exit:
                    failure = supervisor.handle(child)
                    if failure is not None:
                        self.failure = failure
                        self.stop.set()
                        return
            time.sleep(0.2)

    def alive(self) -> bool:
        """Worth waiting for the services: none failed for good and the run is not being stopped."""
        return self.failure is None and not self.stop.is_set()

    def dead_child(self) -> str | None:
        """Why a child died, looking again right now (the watcher polls only every 0.2 s)."""
        if self.failure is not None:  # the supervisor's verdict: it also says whether restarts were spent
            return self.failure
        for child in self.children:
            if not child.expected_exit and child.proc.poll() is not None:
                return child.describe_exit()
        return self.failure

    def shutdown(self, grace_s: float = 10.0) -> None:
        """SIGTERM to every child, SIGKILL to those still up after `grace_s`. Safe to call from two threads
        (the signal handler's and the main one's): the second waits for the first."""
        self.stop.set()
        with self._shutdown_lock:
            self._shutdown(grace_s)

    def _shutdown(self, grace_s: float) -> None:
        for child in self.children:
            child.expected_exit = True
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


def local_learner_checkpoints(run_dir: Path, spec: str,
                              checks: DigestChecks | None = None) -> dict[int, str]:
    """What the learner would report (ListCheckpoints) for `controller.resume=spec`, read from the
    local files before it starts. `latest`: newest first, the checkpoints down to the newest that
    passes its digests and has a controller state that loads (damaged ones passed over with a
    warning). A named step: the complete checkpoints; the learner checks the one it loads."""
    from controller.state import has_state, resume_folder
    from services.learner.checkpoint import complete_checkpoints, resumable_checkpoints

    root = resume_folder(run_dir, spec) / "checkpoints"
    found = (resumable_checkpoints(root, wanted=lambda step: has_state(run_dir, step), checks=checks)
             if spec == "latest" else complete_checkpoints(root))
    return {step: str(path) for step, path in found.items()}


def resolve_local_resume(cfg: JobConfig) -> str:
    """`controller.resume` under `rlfleet run`: the learner is not started yet, so its checkpoints are
    read here, where both roles' files are local; the learner is then started from the chosen one.
    The controller is handed the chosen step by name, so it does not walk the run's states again
    (and warn a second time about a damaged one it passes over). Returns the digest checks made
    (DigestChecks.export), for the learner: each checkpoint's files are read once per resume."""
    from controller.state import resolve_resume

    checks = DigestChecks()
    found = local_learner_checkpoints(cfg.run.dir, cfg.controller.resume, checks)
    state_file, checkpoint = resolve_resume(cfg.run.dir, cfg.controller.resume, found)
    cfg.learner.resume_from = checkpoint
    cfg.controller.resume = str(state_file)
    return checks.export()


def set_aside_earlier_run(run_dir: Path) -> Path | None:
    """A fresh run in a folder that holds an earlier run's outputs would append to its metrics and mix
    its checkpoints with them: the earlier folder is renamed `<name>.<time>` first, nothing deleted."""
    if not any((run_dir / name).exists() for name in ("metrics.jsonl", "checkpoints", "samples", "journal")):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(run_dir.stat().st_mtime))
    target = run_dir.with_name(f"{run_dir.name}.{stamp}")
    suffix = 1
    while target.exists():
        target, suffix = run_dir.with_name(f"{run_dir.name}.{stamp}-{suffix}"), suffix + 1
    run_dir.rename(target)
    return target


def stopping_line(last_step: int | None) -> str:
    """What the first Ctrl-C prints: a checkpoint is promised only when a step has finished."""
    if last_step is None:
        return ("rlfleet: stopping; no step has finished yet, so there is nothing to checkpoint (Ctrl-C "
                "again to stop at once)")
    return (f"rlfleet: stopping; checkpointing the last finished step ({last_step}) first (Ctrl-C again to "
            "stop at once)")


def ending_line(cfg: JobConfig, step: int) -> str:
    """What a run that ended by itself says before it stops its services."""
    name, max_steps = cfg.run.name, cfg.controller.max_steps
    if step >= max_steps:
        return f"rlfleet: run {name} finished: step {step}/{max_steps}; stopping the services"
    return f"rlfleet: run {name} ended after step {step} of {max_steps}; stopping the services"


def run_job(cfg: JobConfig) -> dict[str, Any]:
    from controller.main import check_data_files, prepare_data, prompt_length_limit, run_controller
    from rlfleet.logging import setup_logging
    from rlfleet.models.resolve import resolve_model_path

    print(f"rlfleet: run {cfg.run.name} -> {cfg.run.dir}", flush=True)
    # Inputs first, outputs after: a missing file or a bad model fails before an earlier run's folder is
    # moved aside. Build the embedded model once, before the services race for it; lengths that cannot
    # fit the model's context fail here, before any service starts.
    check_data_files(cfg)
    if cfg.env.name and not cfg.env.address:  # served by this run: a name that names nothing fails now
        from environments.registry import environment_class

        environment_class(cfg.env.name)
    prompt_length_limit(cfg, resolve_model_path(cfg.model.path))
    if not cfg.controller.resume and cfg.learner.resume_from is None:
        moved = set_aside_earlier_run(cfg.run.dir)
        if moved is not None:
            print(f"rlfleet: the earlier outputs of run {cfg.run.name} moved to {moved} (a fresh run; "
                  "controller.resume=latest continues one instead)", flush=True)
    setup_logging("controller", cfg.run.log_level, cfg.run.dir / "logs" / "controller.log", run=cfg.run.name)
    verdicts = None
    if cfg.controller.resume and cfg.learner.resume_from is None and not cfg.learner.address:
        verdicts = resolve_local_resume(cfg)
    clear_end(cfg.run.dir)  # an earlier end of this folder's run no longer holds
    launcher = Launcher(cfg, checkpoint_verdicts=verdicts)
    finished = threading.Event()
    last_step: list[int] = []  # the steps this process finished (the newest last)

    def stop_services_once_checkpointed() -> None:
        print(stopping_line(last_step[-1] if last_step else None), file=sys.stderr, flush=True)
        if not finished.wait(STOP_GRACE_S):
            launcher.shutdown()

    progress = StepProgress(cfg.controller.max_steps, run_dir=cfg.run.dir)

    def step_done(metrics: dict[str, Any]) -> None:
        last_step.append(int(metrics["step"]))
        print("\n".join(progress.lines(metrics)), flush=True)

    with StopOnSignal(launcher.stop, on_first=stop_services_once_checkpointed) as signals:
        try:
            launcher.spawn_services()
            data = prepare_data(cfg)  # the prompts are read while the services load
            addresses = launcher.await_addresses()
            print("rlfleet: services " + ", ".join(f"{r}@{a}" for r, a in addresses.items()), flush=True)
            summary = run_controller(cfg, addresses, stop=launcher.stop, alive=launcher.alive, data=data,
                                     on_step=step_done)
            # said (and recorded for `rlfleet status`) before the services stop, which takes seconds
            if signals.received is not None:
                record_end(cfg.run.dir, STOPPED)
            elif launcher.failure is None:
                record_end(cfg.run.dir, FINISHED)
                print(ending_line(cfg, last_step[-1] if last_step else 0), flush=True)
        except RlfleetError as exc:
            if signals.received is None:  # else leaving the block says Interrupted (rlfleet/app/interrupt.py)
                time.sleep(0.5)  # a dead peer is usually why an RPC failed: name it rather than the RPC
                dead = launcher.dead_child()
                record_end(cfg.run.dir, FAILED, dead or str(exc))
                if dead:
                    raise RlfleetError(dead) from None
            else:
                record_end(cfg.run.dir, STOPPED)
            raise
        except BaseException as exc:  # a second Ctrl-C (KeyboardInterrupt), or a bug
            interrupted = signals.received is not None or isinstance(exc, KeyboardInterrupt)
            record_end(cfg.run.dir, STOPPED if interrupted else FAILED,
                       None if interrupted else f"{type(exc).__name__}: {exc}")
            raise
        finally:
            launcher.shutdown()
            finished.set()
    if launcher.failure:
        record_end(cfg.run.dir, FAILED, launcher.failure)
        raise RlfleetError(launcher.failure)
    if progress.summary():
        print(progress.summary(), flush=True)
    print(f"rlfleet: done; metrics in {cfg.run.dir / 'metrics.jsonl'}", flush=True)
    return summary
