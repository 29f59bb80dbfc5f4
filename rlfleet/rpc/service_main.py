"""Runs one service process: bind, announce, load the model, serve until SIGTERM.

The port is bound before the (slow) model load so the address is known at once;
health says NOT_SERVING until the load finished. The bound address is announced
in `<run_dir>/services/<role>.json` for `rlfleet run` and `rlfleet status`.

A load that fails for a reason a restart cannot change (a config value, a data file, a
damaged checkpoint: ConfigError, DataError, CheckpointError) ends the process with exit code
LOAD_FAILED_EXIT after writing its one-line error to `<run_dir>/services/<name>.load-error`,
so `rlfleet run` reports that line and does not restart the service (rlfleet/app/supervisor.py).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from rlfleet.config import JobConfig, ServiceEndpointConfig
from rlfleet.errors import CheckpointError, ConfigError, DataError
from rlfleet.logging import set_log_fields, setup_logging
from rlfleet.metrics import ServiceMetrics
from rlfleet.rpc.security import Security
from rlfleet.rpc.server import ServiceServer

log = structlog.get_logger(__name__)

PARENT_PID_ENV = "RLFLEET_PARENT_PID"  # set by `rlfleet run` on the services it starts
LOAD_FAILED_EXIT = 78  # sysexits' EX_CONFIG: failed while loading, for a reason a restart cannot change
DETERMINISTIC_LOAD_ERRORS = (ConfigError, DataError, CheckpointError)


def load_error_path(run_dir: Path, name: str) -> Path:
    return run_dir / "services" / f"{name}.load-error"


def read_load_error(run_dir: Path, name: str) -> str | None:
    """The one-line error a service of this run wrote when it failed while loading, if any."""
    try:
        return load_error_path(run_dir, name).read_text().strip() or None
    except OSError:
        return None


def _exit_while_loading(signum: int, _frame: object) -> None:
    os._exit(128 + signum)


def _fail_loading(run_dir: Path, name: str, server: ServiceServer, exc: BaseException) -> None:
    message = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, whatever the error spans
    log.error("failed while loading; not worth a restart", error=message)
    path = load_error_path(run_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(message + "\n")
    os.replace(tmp, path)
    print(f"rlfleet: the {name} service failed while loading: {message}", file=sys.stderr, flush=True)
    server.stop(grace_s=0)
    sys.exit(LOAD_FAILED_EXIT)


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def stop_when_parent_exits(server: ServiceServer, parent_pid: int, poll_s: float = 1.0) -> threading.Thread:
    """A service started by `rlfleet run` stops when that process is gone, even when it was SIGKILLed and
    could not stop its services itself: no orphan holding a GPU and a port."""
    def watch() -> None:
        while not server.stopped.wait(poll_s):
            if _process_gone(parent_pid):
                log.warning("the rlfleet run that started this service is gone; stopping",
                            parent_pid=parent_pid)
                server.stop()
                return
    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def announce(run_dir: Path, role: str, address: str, metrics_port: int, name: str | None = None) -> Path:
    folder = run_dir / "services"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name or role}.json"
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    # `host`: where `pid` lives; `rlfleet status` looks at the process only on that machine
    tmp.write_text(json.dumps({"role": role, "name": name or role, "address": address,
                               "metrics_port": metrics_port, "pid": os.getpid(),
                               "host": socket.gethostname(), "started": time.time()}))
    os.replace(tmp, path)
    return path


def reannounce(run_dir: Path, name: str, address: str) -> None:
    """Rewrites `name`'s announcement with the address others reach it at, when that is not the one it
    bound (a rollout bound to 0.0.0.0 that joined a fleet at its container's address)."""
    path = run_dir / "services" / f"{name}.json"
    info = json.loads(path.read_text())
    if info["address"] == address:
        return
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({**info, "address": address}))
    os.replace(tmp, path)


def run_service(role: str, cfg: JobConfig, endpoint: ServiceEndpointConfig, service_names: list[str],
                add_fn: Callable, servicer: object, load: Callable[[], None], name: str | None = None,
                security: Security | None = None,
                on_serving: Callable[[ServiceServer], None] | None = None, uses_torch: bool = True) -> None:
    """`servicer` must have `attach(core)`; `load()` builds the core and attaches it. `security`: the
    server's TLS and token (default: built from cfg.security and cfg.limits). `on_serving(server)` runs
    once it serves (a rollout joining a running job's fleet); an error there stops the server.
    `uses_torch`: False for a service that does no tensor work (the reward service without a reward
    model), which then never imports torch (~250 MB and a second of start-up)."""
    name = name or role
    setup_logging(name, cfg.run.log_level, cfg.run.dir / "logs" / f"{name}.log", run=cfg.run.name)
    if cfg.run.threads_per_service and uses_torch:
        import torch

        torch.set_num_threads(cfg.run.threads_per_service)
    if uses_torch and isinstance(getattr(endpoint, "device", None), str):
        from rlfleet import host_memory
        from rlfleet.devices import runs_on_cpu

        if runs_on_cpu(endpoint.device):  # before the server's threads exist (rlfleet/host_memory.py)
            host_memory.one_heap_for_all_threads()
    if cfg.run.release_freed_memory and uses_torch:
        from rlfleet.host_memory import release_after_each_step

        release_after_each_step(True)
    metrics: ServiceMetrics = servicer.metrics
    if role != "reward":  # every line says which policy version the service holds when it is logged
        set_log_fields(policy_version=metrics.policy_version_now)
    metrics_port = metrics.serve(endpoint.host, endpoint.metrics_port)
    security = security or Security.from_config(cfg.security, cfg.limits)
    server = ServiceServer(service_names, endpoint.host, endpoint.port, security=security)
    server.add(add_fn, servicer)
    # Until it serves, SIGTERM ends the process at once: a model load cannot be interrupted, and a
    # service stopped while loading (its run failed or was stopped) holds nothing worth a clean stop.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_while_loading)
    server.start()
    if os.environ.get(PARENT_PID_ENV):
        stop_when_parent_exits(server, int(os.environ[PARENT_PID_ENV]))
    announce(cfg.run.dir, role, server.address, metrics_port, name)
    servicer.metrics_port = metrics_port
    log.info("loading", role=role, address=server.address, metrics_port=metrics_port)
    try:
        load()
    except DETERMINISTIC_LOAD_ERRORS as exc:
        _fail_loading(cfg.run.dir, name, server, exc)
    server.install_signal_handlers()  # from now on a signal stops it cleanly, letting RPCs finish
    server.mark_serving()
    # on the terminal of a service started by hand (`rlfleet run` sends its services' stdout nowhere)
    print(f"rlfleet {name} service: serving on {server.address}", flush=True)
    if on_serving is not None:
        try:
            on_serving(server)
        except BaseException:
            server.stop(grace_s=0)
            raise
    server.wait()
