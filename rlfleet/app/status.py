"""`rlfleet status RUN_DIR`: every service of a run, as `ray list actors` showed verl users.

One row per service announced in `RUN_DIR/services/<role>.json` (and per service
the controller uses that was started elsewhere): address, pid, /metrics port,
restarts by `rlfleet run` (services/restarts.jsonl), health, policy version,
step, load (queued work), in-flight RPCs, last error.
The controller row comes from its GetRunStatus RPC, and so does every rollout replica in the run's
fleet (`fleet`: live, joining or leaving, and whether it joined while the run went on) — replicas
that joined from other machines included — and the environment server's episodes, failures by cause,
last error and outage (a server `rlfleet run` did not start is listed too, pid `external`).

Announce files outlive processes killed -9. A replica the controller (or, with the controller gone,
the run's journal) records as left is shown with health `LEFT`; a replica's announce file whose
process is gone (or, from another machine, that nothing answers at) and that the running controller
does not list is shown `STALE`. Neither counts against the run's health: the exit code is 0 when
every other row is SERVING.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from controller.journal import JOURNAL, departed_replicas
from rlfleet.errors import DataError
from rlfleet.proto.v1 import (
    common_pb2,
    controller_pb2_grpc,
    learner_pb2_grpc,
    reward_pb2_grpc,
    rollout_pb2_grpc,
)
from rlfleet.rpc.channel import health_check, open_channel
from rlfleet.rpc.security import Security
from rlfleet.app.openenv_check import is_openenv_address
from rlfleet.app.run_end import Ended, recorded_end, where_it_ended

_STUBS = {
    "rollout": rollout_pb2_grpc.RolloutStub,
    "reward": reward_pb2_grpc.RewardStub,
    "learner": learner_pb2_grpc.LearnerStub,
}
_UNITS = {"rollout": "prompts", "reward": "items", "learner": "samples"}
LEFT, STALE = "LEFT", "STALE"  # health of a row that is no longer part of the run (not a failure)
COLUMNS = (
    "role",
    "address",
    "pid",
    "restarts",
    "metrics_port",
    "health",
    "version",
    "step",
    "load",
    "in_flight",
    "fleet",
    "last_error",
)


def _kind(name: str) -> str:
    """`rollout-2` (a replica), `rollout-node7-1234` (one that joined) -> `rollout`."""
    if name.startswith("rollout-"):
        return "rollout"
    base, _, index = name.rpartition("-")
    return base if base and index.isdigit() else name


def _row(role: str, address: str, **extra: Any) -> dict[str, Any]:
    """`role` is the service's name (`rollout-1` for a second replica)."""
    row = dict.fromkeys(COLUMNS, "-")
    row.update({"role": role, "address": address, "last_error": "", **extra})
    return row


def _service_load(role: str, stats: dict[str, float]) -> str:
    parts = [f"queue {stats.get('queue_depth', 0):.0f} {_UNITS.get(role, '')}".rstrip()]
    if role == "rollout":
        parts.append(f"{stats.get('tokens', 0):.0f} tokens")
    elif role == "reward":
        parts.append(f"{stats.get('scored', 0):.0f} scored")
    return ", ".join(parts)


def _query_service(row: dict[str, Any], channel: grpc.Channel) -> None:
    kind = _kind(row["role"])
    stub_cls = _STUBS.get(kind)
    if stub_cls is None:
        return
    st = stub_cls(channel).GetStatus(common_pb2.GetStatusRequest(), timeout=5)
    stats = dict(st.stats)
    row.update(
        version=st.policy_version if kind != "reward" else "-",
        in_flight=st.in_flight,
        last_error=st.last_error,
        load=_service_load(kind, stats),
    )
    if "step" in stats:
        row["step"] = int(stats["step"])
    if st.metrics_port and row["metrics_port"] == "-":
        row["metrics_port"] = st.metrics_port


def _environment_load(env: Any) -> str:
    """An environment's row as the controller sees it: its episodes and failures over the run."""
    failed = sum(env.failed.values())
    load = f"{env.episodes} episodes, {failed} failed"
    if failed:
        by_cause = sorted(env.failed.items(), key=lambda item: -item[1])
        load += " (" + ", ".join(f"{cause} {n}" for cause, n in by_cause) + ")"
    return load


def _fill_environment(row: dict[str, Any], env: Any) -> None:
    row["load"] = _environment_load(env)
    if env.outage != "running":
        trial = " (health says SERVING, no episode answered yet)" if env.outage == "trial" else ""
        row["last_error"] = f"outage for {env.outage_s:.0f}s{trial}: {env.last_error}"
    elif env.last_error and not row["last_error"]:
        row["last_error"] = env.last_error


def _query_controller(row: dict[str, Any], channel: grpc.Channel, fleet: dict[str, str],
                      environments: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """Fills the controller row, `fleet` (address -> membership) and `environments` (address -> what the
    controller knows of it); returns the (role, address) of the services it uses."""
    st = controller_pb2_grpc.ControllerStub(channel).GetRunStatus(common_pb2.GetStatusRequest(), timeout=5)
    if environments is not None:
        environments.update({env.address: env for env in st.environments})
    last = dict(st.last_metrics)
    members = [m for m in st.fleet if not m.state.startswith("left")]
    for m in members:
        fleet[m.address] = f"{m.state}{' (joined)' if m.joined else ''}, {m.groups} groups"
    for m in st.fleet:  # `left: <reason>`, unless the address is a member again
        fleet.setdefault(m.address, m.state)
    load = f"{last.get('controller/buffered_groups', 0):.0f} groups buffered"
    if members:
        load += f", {sum(m.state != 'joining' for m in members)} replicas"
    if "reward/mean" in last:
        load += f", reward {last['reward/mean']:.3f}"
    row.update(version=st.policy_version, step=st.step, load=load)
    return [(s.role, s.address) for s in st.services]


def _query(row: dict[str, Any], security: Security | None, fleet: dict[str, str] | None = None,
           environments: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    channel = open_channel(row["address"], security)
    try:
        status, why = health_check(channel, timeout_s=2.0)
        if status == "UNREACHABLE":  # once more, longer: a loaded machine may answer late
            status, why = health_check(channel, timeout_s=5.0)
        row["health"] = status
        if status == "UNREACHABLE":
            row["last_error"] = why
            return []
        if row["role"] == "controller":
            return _query_controller(row, channel, fleet if fleet is not None else {}, environments)
        _query_service(row, channel)
    except grpc.RpcError as err:
        row["last_error"] = f"status failed: {err.code().name}"
    finally:
        channel.close()
    return []


def _query_openenv(row: dict[str, Any]) -> None:
    """An OpenEnv server's row (env.kind=openenv): its health is its GET /health."""
    from rlfleet.rpc.openenv_wire import endpoint_of, healthy

    up = healthy(endpoint_of(row["address"]), timeout_s=5.0)
    row["health"] = "SERVING" if up else "UNREACHABLE"
    if not up:
        row["last_error"] = f"GET {endpoint_of(row['address']).http}/health did not answer healthy"


def _restart_counts(folder: Path) -> dict[str, int]:
    """How many times `rlfleet run` restarted each service (rlfleet/app/supervisor.py appends one line
    each)."""
    counts: dict[str, int] = {}
    try:
        lines = (folder / "restarts.jsonl").read_text().splitlines()
    except OSError:
        return counts
    for line in lines:
        try:
            name = json.loads(line)["service"]
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash of `rlfleet run`
        counts[name] = counts.get(name, 0) + 1
    return counts


@dataclass
class _Announced:
    row: dict[str, Any]
    gone: bool = False  # its process ran on this machine and is no longer there
    remote: bool = False  # announced from another machine (its process cannot be looked at)


def _process_gone(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's process
        return False
    try:  # killed but not yet reaped by its parent
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _read_announced(folder: Path) -> list[_Announced]:
    restarts = _restart_counts(folder)
    here = socket.gethostname()
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            info = json.loads(path.read_text())
            name = info.get("name") or info["role"]
            row = _row(name, info["address"], pid=info.get("pid", "-"), restarts=restarts.get(name, 0),
                       metrics_port=info.get("metrics_port") or "-")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            found.append(_Announced(_row(path.stem, "-", last_error=f"unreadable {path.name}: {exc}")))
            continue
        remote = info.get("host", here) != here  # files without `host` were written before it was
        found.append(_Announced(row, gone=not remote and _process_gone(info.get("pid")), remote=remote))
    return found


def _announced(folder: Path) -> list[dict[str, Any]]:
    return [a.row for a in _read_announced(folder)]


def _mark_left(row: dict[str, Any], state: str) -> None:
    row.update(health=LEFT, fleet=state)


def _mark_stale(row: dict[str, Any], why: str) -> None:
    row.update(health=STALE, last_error=f"stale announce file: {why}, and the controller does not list it")


def collect(run_dir: Path, security: Security | None = None) -> list[dict[str, Any]]:
    """`security`: the run's TLS and token (None: plain gRPC)."""
    folder = run_dir / "services"
    if not folder.is_dir():
        raise DataError(f"{run_dir} has no services/ folder: is it a run folder (<output_dir>/<name>)?")
    announced = _read_announced(folder)
    rows = [a.row for a in announced]
    # The controller first: whom it lists (members, those that left, the services it uses) decides
    # how the other rows are read.
    fleet: dict[str, str] = {}
    environments: dict[str, Any] = {}  # address -> the controller's EnvironmentStatus
    used: list[tuple[str, str]] = []
    controller = next((r for r in rows if r["role"] == "controller" and r["address"] != "-"), None)
    if controller is not None:
        used = _query(controller, security, fleet, environments)
    answered = controller is not None and controller["health"] == "SERVING" and not controller["last_error"]
    listed = set(fleet) | {address for _, address in used}
    journal: dict[str, str] | None = None
    for item in announced:
        row = item.row
        if row is controller or row["address"] == "-":
            continue
        address, kind = row["address"], _kind(row["role"])
        if kind != "rollout":  # the controller lists its fleet; other services (an env server) it does not
            _query(row, security)
            if address in environments:
                _fill_environment(row, environments[address])
            continue
        state = fleet.get(address)
        if state is None and address not in listed:
            if journal is None:  # the controller does not list it (or is gone): did it leave?
                journal = departed_replicas(run_dir / "journal" / JOURNAL)
            if address in journal:
                state = f"left: {journal[address]}"
        if state is not None and state.startswith("left"):
            _mark_left(row, state)
            continue
        unlisted = answered and address not in listed
        if unlisted and item.gone:
            _mark_stale(row, f"its process (pid {row['pid']}) is gone")
            continue
        _query(row, security)
        if unlisted and item.remote and row["health"] == "UNREACHABLE":
            _mark_stale(row, f"announced from another machine, nothing answers at {address}")
    known = {(r["role"], r["address"]) for r in rows}
    for role, address in used:  # services the controller uses that announced nowhere here
        if (role, address) not in known:
            known.add((role, address))
            extra = _row(role, address, pid="external")
            _query(extra, security)
            rows.append(extra)
    # replicas that left and announced nowhere here (started by hand elsewhere, or under another
    # run.name): the controller says who left and why
    # (with the controller gone, its journal does)
    departed = {a: state for a, state in fleet.items() if state.startswith("left")}
    if not answered:
        if journal is None:
            journal = departed_replicas(run_dir / "journal" / JOURNAL)
        departed = {a: f"left: {why}" for a, why in journal.items()}
    shown = {r["address"] for r in rows}
    for index, address in enumerate(sorted(a for a in departed if a not in shown), 1):
        extra = _row(f"rollout-left-{index}", address, pid="external")
        _mark_left(extra, departed[address])
        rows.append(extra)
    for address, env in environments.items():  # an environment server started elsewhere
        if ("env", address) not in known and address not in {r["address"] for r in rows}:
            known.add(("env", address))
            extra = _row("env", address, pid="external")
            _query_openenv(extra) if is_openenv_address(address) else _query(extra, security)
            _fill_environment(extra, env)
            rows.append(extra)
    for row in rows:
        if _kind(row["role"]) == "rollout" and row["health"] != LEFT:
            row["fleet"] = fleet.get(row["address"], "-" if not fleet else "not a member")
    order = {"controller": 0, "rollout": 1, "reward": 2, "learner": 3, "env": 4}
    return sorted(rows, key=lambda r: (order.get(_kind(r["role"]), 9), r["role"], r["address"]))


def format_rows(rows: list[dict[str, Any]]) -> str:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS[:-1]} if rows else {}
    lines = ["  ".join(c.ljust(widths.get(c, len(c))) for c in COLUMNS[:-1]) + "  last_error"]
    for r in rows:
        lines.append("  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS[:-1]) + f"  {r['last_error']}")
    return "\n".join(lines)


def prometheus_targets(run_dir: Path) -> list[dict[str, Any]]:
    """Prometheus file_sd entries for the /metrics of every service announced in the run folder."""
    targets = []
    for row in _announced(run_dir / "services"):
        if row["address"] != "-" and row["metrics_port"] != "-":
            host = row["address"].rsplit(":", 1)[0]
            targets.append(
                {
                    "targets": [f"{host}:{row['metrics_port']}"],
                    "labels": {"name": row["role"], "run": run_dir.name},
                }
            )
    return targets


def write_prometheus_targets(run_dir: Path, path: Path) -> int:
    targets = prometheus_targets(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(targets, indent=2) + "\n")
    tmp.replace(path)  # Prometheus never reads a half-written file
    return len(targets)


def ended_run(run_dir: Path) -> Ended | None:
    """The run's end: as `rlfleet run` recorded it (run_end.py), else when its controller and every
    service it announced on this machine are gone (None while any runs, or when one ran elsewhere: their
    rows tell more then)."""
    recorded = recorded_end(run_dir)
    if recorded is not None:
        return recorded
    announced = _read_announced(run_dir / "services") if (run_dir / "services").is_dir() else []
    controller = [a for a in announced if a.row["role"] == "controller"]
    if not controller or any(a.remote or not a.gone for a in announced):
        return None
    return where_it_ended(run_dir)


def print_status(run_dir: str, as_json: bool = False, prometheus_sd: str | None = None,
                 security: Security | None = None) -> int:
    """Exit code 0 when every service is SERVING (replicas that left and stale announce files aside),
    or the run has finished; 1 otherwise."""
    ended = ended_run(Path(run_dir))
    if ended is not None and not as_json and not prometheus_sd:
        print(ended.describe(Path(run_dir)))
        return 0 if ended.finished else 1
    rows = collect(Path(run_dir), security)
    if ended is not None:  # the JSON rows as ever (a replica that left is LEFT from the journal), and
        if not any(row["role"] == "controller" for row in rows):  # the controller's row says how the run
            rows.insert(0, _row("controller", "-"))                # ended (one that failed before it served)
        for row in rows:
            if row["role"] == "controller":
                row.update(health=ended.state.upper(), step=ended.step,
                           last_error=ended.describe(Path(run_dir)).removeprefix("rlfleet: "),
                           ended=ended.as_json())
        print(json.dumps(rows, indent=2))
        return 0 if ended.finished else 1
    if prometheus_sd:
        count = write_prometheus_targets(Path(run_dir), Path(prometheus_sd))
        print(f"rlfleet: wrote {count} Prometheus targets to {prometheus_sd}")
    print(json.dumps(rows, indent=2) if as_json else format_rows(rows))
    counted = [r for r in rows if r["health"] not in (LEFT, STALE)]
    return 0 if counted and all(r["health"] == "SERVING" for r in counted) else 1
