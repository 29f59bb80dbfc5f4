"""The controller at fleet scale (issue 34): N simulated rollout replicas, real gRPC, real controller.

Processes: the real reward service (`rlfleet serve reward`), a simulated learner behind the real
LearnerServicer (bench/fleetsim/learner.py), the real controller (`rlfleet controller`), and
ceil(N / --per-host) replica hosts, each serving up to --per-host replicas, every one a gRPC server
of its own whose engine models an H200 (bench/fleetsim/engine.py, gpu_model.py) and which joins the
run with the real Join RPC. The controller's CPU and memory are read from /proc while it runs.
The weight group is a rendezvous over real sockets (bench/fleetsim/rendezvous.py: a member that dies
inside it hangs the push until the group's timeout, `--group-timeout`); a kill is a crash (the
replica's RPCs in flight are aborted, its connections drop); --per-host spreads the replicas over
several processes. Admission latency is a replica's free slot (its Generate ended) to its next
Generate reaching it; the Train call is also measured beyond the modelled training.

`--slowdown K` multiplies every modelled duration by K (decode, prefill, training, broadcast; the churn
rate counts minutes of the fleet's own time unless --churn-clock wall): the
fleet then produces 1/K of its real rate, which lets a 2-core machine carry the replicas' and the
services' own work. The controller's CPU per group does not depend on K where its work is per group; what
it does per second (a heartbeat per member, before issue 44) weighs K times more per group.

    python bench/fleet_sim.py --replicas 32 --staleness 1 --seconds 60 --out /tmp/fleet
    python bench/fleet_sim.py --replicas 256 --staleness 1 --churn --seconds 90 --out /tmp/fleet
Prints one JSON line of figures and writes it to OUT/<case>/result.json; exits 1 when the run's
invariant broke (controller/journal.py Audit.invariant_errors: prompts lost, trained twice, stranded by
a replica that left without re-queueing them, or in flight at the stop for longer than twice the
longest generation seen).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.fleetsim.engine import GPU_ENV  # noqa: E402
from bench.fleetsim.gpu_model import GpuModel  # noqa: E402
from bench.fleetsim.measure import analyse  # noqa: E402
from bench.fleetsim.model_dir import build_sim_model_dir  # noqa: E402

N_SAMPLES = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _journal_count(run_dir: Path, event: str) -> int:
    path = run_dir / "journal" / "prompts.jsonl"
    if not path.exists():
        return 0
    needles = (f'"event":"{event}"', f'"event": "{event}"')  # as the journal writes it, and did before
    with open(path) as f:
        return sum(any(n in line for n in needles) for line in f)


def _wait_serving(address: str, what: str, procs: list[subprocess.Popen], timeout_s: float = 120) -> None:
    from rlfleet.rpc.channel import health_status, open_channel
    from rlfleet.rpc.security import Security

    channel = open_channel(address, Security())
    deadline = time.monotonic() + timeout_s
    while health_status(channel) != "SERVING":
        for proc in procs:
            if proc.poll() is not None:
                raise SystemExit(f"fleet_sim: {proc.args[:4]} exited with {proc.returncode} "
                                 f"before {what} served")
        if time.monotonic() > deadline:
            raise SystemExit(f"fleet_sim: {what} at {address} did not serve within {timeout_s:g}s")
        time.sleep(0.2)
    channel.close()


def _commit() -> str:
    """The code measured: HEAD, with `+` when the work tree differs."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True)
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


class Sim:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        case = (f"n{args.replicas}_s{args.staleness}" + ("_churn" if args.churn else "")
                + ("_watch" if args.watch else "") + ("_flight" if args.data_plane == "flight" else ""))
        self.out = Path(args.out) / case
        self.out.mkdir(parents=True, exist_ok=True)
        for old in [*self.out.glob("host-*.json"), self.out / "learner.jsonl", self.out / "learner.pause"]:
            old.unlink(missing_ok=True)
        self.run_dir = self.out / "run"
        gpu = GpuModel(max_new_tokens=args.max_new_tokens)
        self.ideal_real = gpu.ideal_groups_per_s(args.prompts_per_request, N_SAMPLES)  # per replica, K = 1
        fleet_ideal = self.ideal_real * args.replicas
        self.slowdown = args.slowdown or max(1.0, fleet_ideal / args.target_rate)
        self.gpu = GpuModel(max_new_tokens=args.max_new_tokens, slowdown=self.slowdown)
        self.ideal = self.ideal_real / self.slowdown
        self.env = {**os.environ, GPU_ENV: json.dumps({k: v for k, v in self.gpu.to_dict().items()}),
                    "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.procs: dict[str, subprocess.Popen] = {}
        self.hosts: list[subprocess.Popen] = []
        self.where: dict[str, int] = {}  # replica name -> host index
        self.alive: list[str] = []
        self.rng = random.Random(0)
        self.count = 0

    def config(self) -> Path:
        a = self.args
        self.ports = {r: free_port() for r in ("reward", "learner", "controller")}
        batch = a.batch or max(32, a.replicas * a.prompts_per_request)
        self.batch = batch
        cfg = {
            "run": {"output_dir": str(self.out), "name": "run", "threads_per_service": 1,
                    "log_level": "warning"},
            "model": {"path": str(build_sim_model_dir(self.out / "model"))},
            "algorithm": {"plugins": ["bench.fleetsim.plugin"]},
            "data": {"builtin_size": 20000},
            "rollout": {"backend": "sim", "n": N_SAMPLES, "max_new_tokens": a.max_new_tokens},
            "reward": {"port": self.ports["reward"], "address": f"127.0.0.1:{self.ports['reward']}"},
            "learner": {"port": self.ports["learner"], "address": f"127.0.0.1:{self.ports['learner']}",
                        "weight_sync_timeout_s": a.group_timeout},
            "controller": {"port": self.ports["controller"], "prompts_per_step": batch,
                           "prompts_per_request": a.prompts_per_request, "max_staleness": a.staleness,
                           "max_steps": 1_000_000, "service_wait_s": 300, "connect_timeout_s": 120,
                           "rpc_timeout_s": 600, "data_plane": a.data_plane},
            "tracking": {"tensorboard": False},
        }
        import yaml
        path = self.out / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def start(self, name: str, *argv: str) -> subprocess.Popen:
        logs = self.out / "logs"
        logs.mkdir(exist_ok=True)
        proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=self.env, text=True,
                                stdin=subprocess.PIPE if name.startswith("host") else subprocess.DEVNULL,
                                stdout=open(logs / f"{name}.out", "w"),  # noqa: SIM115 - the child holds it
                                stderr=open(logs / f"{name}.err", "w"), start_new_session=True)  # noqa: SIM115
        self.procs[name] = proc
        return proc

    def join(self, factor: float = 1.0) -> None:
        name = f"r{self.count}"
        self.count += 1
        host = self.count % len(self.hosts) if len(self.alive) >= self.args.replicas else \
            len(self.alive) // self.args.per_host
        self.where[name] = host
        self._send(host, f"join {name} {factor}")
        self.alive.append(name)

    def kill(self) -> None:
        candidates = [n for n in self.alive if n != "r0"]  # r0 is the straggler in a churn run
        name = self.rng.choice(candidates)
        self.alive.remove(name)
        self._send(self.where[name], f"kill {name}")

    def _send(self, host: int, line: str) -> None:
        self.hosts[host].stdin.write(line + "\n")
        self.hosts[host].stdin.flush()

    def run(self) -> dict:
        a = self.args
        config = self.config()
        cfg_args = ("--config", str(config))
        self.start("reward", "-m", "rlfleet.app.cli", "serve", "reward", *cfg_args)
        self.start("learner", "-m", "bench.fleetsim.learner", str(config), str(self.out),
                   str(a.learner_tok_s))
        services = list(self.procs.values())
        _wait_serving(f"127.0.0.1:{self.ports['reward']}", "the reward service", services)
        _wait_serving(f"127.0.0.1:{self.ports['learner']}", "the learner", services)
        controller = self.start("controller", "-m", "rlfleet.app.cli", "controller", *cfg_args)
        address = f"127.0.0.1:{self.ports['controller']}"
        _wait_serving(address, "the controller", [*services, controller])
        for i in range(math.ceil(a.replicas / a.per_host)):
            self.hosts.append(self.start(f"host-{i}", "-m", "bench.fleetsim.replicas", str(config), address,
                                         str(self.out), str(i), *(["--watch"] if a.watch else [])))
        for i in range(a.replicas):
            self.join(factor=5.0 if a.churn and i == 0 else 1.0)
        # Warm-up: every replica joined, then one more step trained with all of them.
        deadline = time.monotonic() + a.start_timeout
        trained = None
        while trained is None or _journal_count(self.run_dir, "trained") < trained + self.batch:
            self._check_alive()
            if trained is None and _journal_count(self.run_dir, "joined") >= a.replicas:
                trained = _journal_count(self.run_dir, "trained")
            if time.monotonic() > deadline:
                raise SystemExit(f"fleet_sim: not warmed up within {a.start_timeout}s "
                                 f"(joined {_journal_count(self.run_dir, 'joined')}/{a.replicas})")
            time.sleep(0.5)
        time.sleep(a.warmup)
        t0, cpu0, rss = time.time(), _cpu_s(controller.pid), []
        others0 = {name: _cpu_s(p.pid) for name, p in self.procs.items() if name != "controller"}
        profile = None
        if a.profile:
            profile = subprocess.Popen([a.profile, "record", "-p", str(controller.pid), "-d",
                                        str(int(a.seconds)), "-r", "200", "--gil", "-f", "raw", "-o",
                                        str(self.out / "profile.txt"), "--nonblocking"],
                                       stdout=subprocess.DEVNULL,
                                       stderr=open(self.out / "logs" / "pyspy.err", "w"))  # noqa: SIM115
        # --churn-per-min is a fraction of the fleet a minute of the fleet's own time (the issue's "10 % a
        # minute"): under the time dilation K a wall-clock minute is 1/K of one (--churn-clock wall: K times
        # harsher, the figures before 2026-12-05's second session)
        per_wall_min = a.churn_per_min / (self.slowdown if a.churn_clock == "fleet" else 1.0)
        churn_every = 60.0 / (per_wall_min * a.replicas) if a.churn else float("inf")
        next_churn, kill_next = t0 + churn_every / 2, True
        paused = False
        while time.time() < t0 + a.seconds:
            self._check_alive()
            now = time.time()
            rss.append(_rss_mb(controller.pid))
            if now >= next_churn:
                self.kill() if kill_next else self.join()
                kill_next = not kill_next
                next_churn += churn_every / 2
            if a.churn and a.pause_s and not paused and now >= t0 + a.pause_at:
                (self.out / "learner.pause").touch()
                paused = True
            if paused and now >= t0 + a.pause_at + a.pause_s:
                (self.out / "learner.pause").unlink(missing_ok=True)
            time.sleep(0.2)
        t1, cpu1 = time.time(), _cpu_s(controller.pid)
        self.cpu_share = {name: round((_cpu_s(self.procs[name].pid) - c0) / (t1 - t0), 3)
                          for name, c0 in others0.items() if self.procs[name].poll() is None}
        rss.append(_rss_mb(controller.pid))
        if profile is not None:
            profile.wait(timeout=60)
        return self.finish(controller, (t0, t1), (cpu0, cpu1), rss)

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise SystemExit(f"fleet_sim: {name} exited with {proc.returncode} "
                                 f"(logs: {self.out / 'logs'})")

    def finish(self, controller: subprocess.Popen, window, cpu, rss) -> dict:
        (self.out / "learner.pause").unlink(missing_ok=True)
        controller.send_signal(signal.SIGINT)  # stops at its next check, checkpoints, exits
        try:
            controller.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(controller.pid, signal.SIGKILL)
        for host in self.hosts:
            host.stdin.write("stop\n")
            host.stdin.flush()
        for host in self.hosts:
            host.wait(timeout=120)
        for name in ("learner", "reward"):
            os.killpg(self.procs[name].pid, signal.SIGTERM)
            self.procs[name].wait(timeout=30)
        a = self.args
        pause = None
        if a.churn and a.pause_s:
            pause = (window[0] + a.pause_at, window[0] + a.pause_at + a.pause_s)
        result = analyse(self.out, self.run_dir, window, cpu, rss, self.ideal, a.staleness, pause=pause)
        result.update(watch=self.args.watch, data_plane=self.args.data_plane, replicas=self.args.replicas,
                      staleness=self.args.staleness, churn=self.args.churn,
                      churn_per_min=self.args.churn_per_min, churn_clock=self.args.churn_clock,
                      slowdown=self.slowdown, batch=self.batch,
                      prompts_per_request=self.args.prompts_per_request,
                      ideal_per_replica_real=self.ideal_real, per_host=self.args.per_host,
                      controller_exit=controller.returncode, load_avg=os.getloadavg(),
                      cpu_share_others=self.cpu_share, commit=_commit())
        (self.out / "result.json").write_text(json.dumps(result, indent=1))
        return result

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--staleness", type=int, default=1)
    p.add_argument("--seconds", type=float, default=60, help="the measured window")
    p.add_argument("--warmup", type=float, default=5,
                   help="seconds after the first step trained with every replica before measuring")
    p.add_argument("--start-timeout", type=float, default=600)
    p.add_argument("--out", default="/tmp/fleet_sim")
    p.add_argument("--per-host", type=int, default=64, help="replicas per host process")
    p.add_argument("--prompts-per-request", type=int, default=8)
    p.add_argument("--batch", type=int, default=0, 
                   help="prompts_per_step (default: N x prompts_per_request)")
    p.add_argument("--max-new-tokens", type=int, default=428)
    p.add_argument("--learner-tok-s", type=float, default=8e6,
                   help="simulated learner speed (default ~108 H200s at our measured 74.7k tok/s)")
    p.add_argument("--slowdown", type=float, default=0, help="time dilation K (default: from --target-rate)")
    p.add_argument("--target-rate", type=float, default=50.0,
                   help="groups/s the dilated fleet should produce (sets K when --slowdown is 0)")
    p.add_argument("--churn", action="store_true",
                   help="kill and join replicas, one replica 5x slower, learner paused --pause-s")
    p.add_argument("--churn-per-min", type=float, default=0.10,
                   help="fraction of N killed (and joined) a minute")
    p.add_argument("--churn-clock", choices=["fleet", "wall"], default="fleet",
                   help="whose minute --churn-per-min counts: the fleet's (dilated by K) or the wall clock's")
    p.add_argument("--pause-at", type=float, default=20.0)
    p.add_argument("--pause-s", type=float, default=30.0)
    p.add_argument("--watch", action="store_true",
                   help="replicas also run the real membership watch (GetRunStatus every 2 s each)")
    p.add_argument("--data-plane", choices=["inline", "flight"], default="inline",
                   help="controller.data_plane: token payloads through the controller, or on Arrow Flight")
    p.add_argument("--group-timeout", type=float, default=120.0,
                   help="learner.weight_sync_timeout_s: how long a dead member hangs a push (wall seconds)")
    p.add_argument("--profile", default="", help="path of py-spy: record the controller during the window")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    sim = Sim(parse_args(argv))
    try:
        result = sim.run()
    finally:
        sim.cleanup()
    print(json.dumps(result), flush=True)
    if result["invariant_errors"]:  # the run's invariant: nothing lost, stranded, held or trained twice
        raise SystemExit("fleet_sim: invariant broken: " + "; ".join(result["invariant_errors"]))
    return result


if __name__ == "__main__":
    main()
