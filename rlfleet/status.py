"""`rlfleet status RUN_DIR`: address, health, version, load and last error of each service."""
from __future__ import annotations

import json
from pathlib import Path

import grpc

from rlfleet.errors import DataError
from rlfleet.proto.v1 import common_pb2, learner_pb2_grpc, reward_pb2_grpc, rollout_pb2_grpc
from rlfleet.rpc.channel import health_status, open_channel

_STUBS = {"rollout": rollout_pb2_grpc.RolloutStub, "reward": reward_pb2_grpc.RewardStub,
          "learner": learner_pb2_grpc.LearnerStub}


def collect(run_dir: Path) -> list[dict]:
    folder = run_dir / "services"
    if not folder.is_dir():
        raise DataError(f"{run_dir} has no services/ folder: is it a run folder (<output_dir>/<name>)?")
    rows = []
    for path in sorted(folder.glob("*.json")):
        info = json.loads(path.read_text())
        row = {"role": info["role"], "address": info["address"], "pid": info.get("pid"),
               "health": "-", "version": "-", "in_flight": "-", "last_error": ""}
        channel = open_channel(info["address"])
        try:
            row["health"] = health_status(channel)
            stub_cls = _STUBS.get(info["role"])
            if stub_cls is not None and row["health"] != "UNREACHABLE":
                st = stub_cls(channel).GetStatus(common_pb2.GetStatusRequest(), timeout=5)
                row.update(version=st.policy_version, in_flight=st.in_flight, last_error=st.last_error)
        except grpc.RpcError as err:
            row["last_error"] = f"status failed: {err.code().name}"
        finally:
            channel.close()
        rows.append(row)
    return rows


def print_status(run_dir: str) -> int:
    rows = collect(Path(run_dir))
    header = f"{'role':<11}{'address':<22}{'pid':<9}{'health':<13}{'version':<9}{'in_flight':<10}last_error"
    print(header)
    for r in rows:
        print(f"{r['role']:<11}{r['address']:<22}{str(r['pid']):<9}{r['health']:<13}{str(r['version']):<9}"
              f"{str(r['in_flight']):<10}{r['last_error']}")
    return 0 if all(r["health"] == "SERVING" for r in rows) else 1
