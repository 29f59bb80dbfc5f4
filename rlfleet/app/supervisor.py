"""Restarts a service of `rlfleet run` that died, a bounded number of times, with backoff.

A dead child is restarted `run.max_restarts` times at most (over the run), after 1 s, 2 s,
4 s, … on the same port (the controller's channels reconnect by themselves), the learner
from its newest checkpoint (`learner.resume_from=auto`). Each restart is printed, logged
and appended to `<run_dir>/services/restarts.jsonl`. Once the restarts are spent the run
stops, names the service and says so ("restarts spent 3/3").

A service that failed while loading for a reason a restart would repeat (exit code
LOAD_FAILED_EXIT, rlfleet/rpc/service_main.py: a bad config value, data file or checkpoint)
is not restarted: the run stops at once with the service's own one-line error.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from rlfleet.rpc.service_main import load_error_path

log = structlog.get_logger(__name__)


@dataclass
class _Restarts:
    count: int = 0
    due: float | None = None  # monotonic time of the pending restart


class Supervisor:
    def __init__(self, max_restarts: int, run_dir: Path, backoff_s: float = 1.0):
        self.max_restarts = max_restarts
        self.run_dir = run_dir
        self.backoff_s = backoff_s
        self._state: dict[str, _Restarts] = {}

    def restarts(self, name: str) -> int:
        return self._state.get(name, _Restarts()).count

    def handle(self, child: Any) -> str | None:
        """Called while `child` is dead: schedules or performs its restart (None), or says why
        the run must stop (restarts spent)."""
        state = self._state.setdefault(child.role, _Restarts())
        if state.due is None:
            why = child.describe_exit()
            if child.load_error() is not None:
                return why + "; not restarted: it failed while loading, which a restart would repeat"
            if state.count >= self.max_restarts:
                return why + (f"; restarts spent {state.count}/{self.max_restarts} (run.max_restarts)"
                              if self.max_restarts else "; not restarted (run.max_restarts=0)")
            delay = self.backoff_s * (2 ** state.count)
            print(f"rlfleet: {why}; restarting it ({state.count + 1}/{self.max_restarts}) in {delay:g}s",
                  file=sys.stderr, flush=True)
            # info: the line above is the console's; the log file keeps the fields
            log.info("service died; restarting", service=child.role, pid=child.proc.pid,
                     code=child.proc.returncode, attempt=state.count + 1, delay_s=delay)
            self._record({"service": child.role, "pid": child.proc.pid, "code": child.proc.returncode,
                          "attempt": state.count + 1, "delay_s": delay})
            state.due = time.monotonic() + delay
            return None
        if time.monotonic() < state.due:
            return None
        self._respawn(child)
        state.count += 1
        state.due = None
        return None

    def _respawn(self, child: Any) -> None:
        role = child.cmd[child.cmd.index("serve") + 1]
        extra = []
        announced = self.run_dir / "services" / f"{child.role}.json"
        try:  # the same port: clients keep their address and reconnect
            port = json.loads(announced.read_text())["address"].rpartition(":")[2]
            if "--port" not in child.cmd:  # an environment server's command names its port already
                extra.append(f"{role}.port={port}")
        except (OSError, ValueError, KeyError):
            pass
        if role == "learner":
            extra.append("learner.resume_from=auto")  # its newest checkpoint, or fresh if none yet
        if child.run_dir is not None:  # a record left by an earlier life must not describe this one
            load_error_path(child.run_dir, child.role).unlink(missing_ok=True)
        with open(child.stderr_path, "a") as stderr:
            child.proc = subprocess.Popen([*child.cmd, *extra], stdout=subprocess.DEVNULL, stderr=stderr,
                                          env=child.env, start_new_session=True)
        print(f"rlfleet: restarted the {child.role} service (pid {child.proc.pid})", file=sys.stderr,
              flush=True)
        log.info("service restarted", service=child.role, pid=child.proc.pid)

    def _record(self, entry: dict[str, Any]) -> None:
        path = self.run_dir / "services" / "restarts.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps({"t": round(time.time(), 3), **entry}) + "\n")
