"""Restarts a service of `rlfleet run` that died, a bounded number of times, with backoff.

A dead child is restarted `run.max_restarts` times at most (over the run), after 1 s, 2 s,
4 s, … on the same port (the controller's channels reconnect by themselves), the learner
from its newest checkpoint (`learner.resume_from=auto`). Each restart is printed, logged
and appended to `<run_dir>/services/restarts.jsonl`. Once the restarts are spent the run
stops and names the service, as it did before restarts existed.
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
            if state.count >= self.max_restarts:
                return why + (f" (restarted {state.count} times already, "
                              f"run.max_restarts={self.max_restarts})"
                              if state.count else "")
            delay = self.backoff_s * (2 ** state.count)
            print(f"rlfleet: {why}; restarting it ({state.count + 1}/{self.max_restarts}) in {delay:g}s",
                  file=sys.stderr, flush=True)
            log.warning("service died; restarting", service=child.role, pid=child.proc.pid,
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
            extra.append(f"{role}.port={port}")
        except (OSError, ValueError, KeyError):
            pass
        if role == "learner":
            extra.append("learner.resume_from=auto")  # its newest checkpoint, or fresh if none yet
        with open(child.stderr_path, "a") as stderr:
            child.proc = subprocess.Popen([*child.cmd, *extra], stdout=subprocess.DEVNULL, stderr=stderr,
                                          env=child.env, start_new_session=True)
        print(f"rlfleet: restarted the {child.role} service (pid {child.proc.pid})", file=sys.stderr,
              flush=True)
        log.warning("service restarted", service=child.role, pid=child.proc.pid)

    def _record(self, entry: dict[str, Any]) -> None:
        path = self.run_dir / "services" / "restarts.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps({"t": round(time.time(), 3), **entry}) + "\n")
