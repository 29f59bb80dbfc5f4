"""One process hosting many simulated rollout replicas, each a real gRPC server of its own.

Each replica is what `rlfleet serve rollout --join` builds: the real RolloutServicer over an engine
made by the engine registry (`rollout.backend=sim`), on its own ServiceServer (own port, health,
reflection, interceptors), joined to the controller with the real Join RPC
(rlfleet.app.fleet_member.FleetMembership). Many replicas share one process so that N = 256 fits
on a small machine; the process's own lag is measured (each group's send time against the time the
modelled GPU finished it) to show it is not the bottleneck.

Commands, one a line on stdin: `join NAME [FACTOR]` (FACTOR > 1: a straggler), `kill NAME` (a crash: the
server aborts its RPCs in flight, no Leave, its weight-group and controller connections drop),
`drain NAME` (Leave, then stop), `stop` (writes <out>/host-<id>.json and exits).

    python -m bench.fleetsim.replicas CONFIG CONTROLLER OUT_DIR HOST_ID [--watch]
With --watch each replica also runs the real membership watch (GetRunStatus every 2 s, join again
when dropped, stop when drained), as `rlfleet serve rollout --join` does.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlfleet.config import load_config
from rlfleet.dataplane.flight import PayloadClient, PayloadServer
from rlfleet.dataplane.push import PayloadPusher
from rlfleet.dataplane.store import MemoryStore
from rlfleet.extensions import ROLLOUT_ENGINES
from rlfleet.models.resolve import resolve_model_path
from rlfleet.proto.v1 import rollout_pb2_grpc
from rlfleet.rpc.security import Security
from rlfleet.rpc.server import ServiceServer
from rlfleet.app.fleet_member import FleetMembership
from services.rollout.servicer import SERVICE_NAME, RolloutServicer


class Replica:
    def __init__(self, name: str, cfg, security: Security, controller: str, factor: float, seed: int,
                 watch: bool = False):
        self.name, self.cfg, self.security, self.controller = name, cfg, security, controller
        model_dir = resolve_model_path(cfg.model.path)
        self.engine = ROLLOUT_ENGINES.get(cfg.rollout.backend)(model_dir, "sim", None, cfg.rollout, seed)
        self.engine.factor = factor
        self.servicer = RolloutServicer(limits=cfg.limits, weight_token=security.token)
        self.servicer.attach(self.engine)
        self.payload_server = None
        if cfg.controller.data_plane == "flight":  # as `rlfleet serve rollout` does: its own Flight server
            self.payload_server = PayloadServer(MemoryStore(), "127.0.0.1", 0, security)
            self.servicer.payloads = (self.payload_server.store, self.payload_server.address)
            store, address = self.servicer.payloads
            pushes = PayloadClient(security, timeout_s=cfg.controller.rpc_timeout_s)  # to the learner's
            self.servicer.pusher = PayloadPusher(store, address, pushes)
        self.status_times: list[float] = []  # when the controller asked its status (issue 44: the heartbeat)
        _count_status_calls(self.servicer, self.status_times)
        self.server = ServiceServer([SERVICE_NAME], "127.0.0.1", 0, max_workers=4, security=security)
        self.server.add(rollout_pb2_grpc.add_RolloutServicer_to_server, self.servicer)
        self.server.start()
        self.server.mark_serving()
        self.member = FleetMembership(controller, security, name, model_dir, cfg.controller.service_wait_s)
        self.started, self.ended = time.time(), 0.0
        self.fate = "live"
        self.member.join(self.server.address)
        if watch:  # as `rlfleet serve rollout --join` does: asks every 2 s, joins again if dropped
            self.member.watch(self.server)

    def kill(self) -> None:
        """A crash as the rest of the run sees it: every RPC in flight (its Generate stream, a pull)
        is aborted, not ended, its weight-group connection and its channel to the controller drop.
        The engine's threads are released after the server is gone, so no stream ends cleanly."""
        self.fate, self.ended = "killed", time.time()
        self.server.stop(grace_s=0)  # in-flight RPCs end CANCELLED on the caller's side
        self.engine.close()
        self.member.close()
        self._stop_payloads()

    def _stop_payloads(self) -> None:
        """The groups it held go with it (a crash loses them; a learner's fetch then fails)."""
        if self.payload_server is not None:
            self.servicer.pusher.close(wait=False)  # what it had not pushed yet goes with it too
            self.payload_server.shutdown()
            self.payload_server = None

    def drain(self) -> None:
        self.fate = "drained"
        self.member.leave("drained", timeout_s=30)
        self.ended = time.time()
        self.engine.close()
        self.server.stop(grace_s=0)
        self.member.close()

    def stop(self) -> None:
        if self.fate == "live":
            self.ended = time.time()
            self.engine.close()
            self.server.stop(grace_s=0)
            self.member.close()
        self._stop_payloads()

    def log(self) -> dict:
        return {"name": self.name, "address": self.server.address, "started": self.started,
                "ended": self.ended, "fate": self.fate, "status_times": self.status_times,
                **self.engine.log()}


def _count_status_calls(servicer: RolloutServicer, times: list[float]) -> None:
    """Each GetStatus the servicer answers appends its time to `times` (set before the servicer is added
    to its server, which looks the method up then)."""
    answer = servicer.GetStatus

    def counted(request, context):
        times.append(time.time())
        return answer(request, context)
    servicer.GetStatus = counted


def main() -> None:
    config, controller, out_dir, host_id = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    watch = sys.argv[5:] == ["--watch"]
    cfg = load_config(config)
    security = Security.from_config(cfg.security, cfg.limits)
    replicas: dict[str, Replica] = {}
    cpu0, wall0 = time.process_time(), time.time()
    pool = ThreadPoolExecutor(max_workers=8)  # joins and drains block on the controller
    lock = threading.Lock()

    def join(name: str, factor: float) -> None:
        replica = Replica(name, cfg, security, controller, factor, seed=hash(name) % 10_000, watch=watch)
        with lock:
            replicas[name] = replica

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "join":
            pool.submit(join, words[1], float(words[2]) if len(words) > 2 else 1.0)
        elif words[0] == "kill" and words[1] in replicas:
            replicas[words[1]].kill()
        elif words[0] == "drain" and words[1] in replicas:
            pool.submit(replicas[words[1]].drain)
        elif words[0] == "stop":
            break
    pool.shutdown(wait=True)
    cpu, wall = time.process_time() - cpu0, time.time() - wall0
    for replica in replicas.values():
        replica.stop()
    (out_dir / f"host-{host_id}.json").write_text(json.dumps(
        {"host": host_id, "cpu_s": cpu, "wall_s": wall, "replicas": [r.log() for r in replicas.values()]}))


if __name__ == "__main__":
    main()
