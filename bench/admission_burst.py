"""The controller's admission in a burst, alone (issue 44): N fleet members wait for work with the gate
closed; a new version opens N slots at once (what every step does at S = 1 when all replicas finish
together) and each member's latency from that notify to its admission is taken, then it asks again.

No gRPC and no replicas: the loop's own admission (GRPOLoop._admit, on threads in the code before
issue 44's hand-off, on the event loop after it), so the figure is the controller's own cost.

    PYTHONPATH=$PWD .venv/bin/python bench/admission_burst.py --members 256 --bursts 10
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import threading
import time
from pathlib import Path

from controller.loop import GRPOLoop
from controller.outputs import RunWriter
from controller.recovery import Stopped
from rlfleet.config import JobConfig
from rlfleet.data.prompts import Prompt, PromptSource


class IdleRollout:
    """A member that is never asked to generate here (the bench stops at admission)."""

    def __init__(self, address: str) -> None:
        self.address = address

    def close(self) -> None:
        pass


def build(members: int, out: Path) -> GRPOLoop:
    cfg = JobConfig.model_validate({
        "run": {"output_dir": str(out), "name": "admission"},
        "controller": {"prompts_per_step": members, "max_staleness": 0, "max_steps": 1,
                       "prompts_per_request": 1}})
    prompts = [Prompt(index=i, text=f"p{i}", prompt_ids=[1, 2], data_source="digits", ground_truth="1")
               for i in range(64)]
    rollouts = [IdleRollout(f"idle:{k}") for k in range(members)]
    loop = GRPOLoop(cfg, PromptSource(prompts, seed=0), rollouts, None, None,
                    RunWriter(out, tensorboard=False))
    loop._admitted = loop.gate.admission_limit(0)  # closed until the first new version
    return loop


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=256)
    parser.add_argument("--bursts", type=int, default=10)
    args = parser.parse_args()
    loop = build(args.members, Path(tempfile.mkdtemp()))
    admitted: list[float] = []
    lock = threading.Lock()
    on_loop = asyncio.iscoroutinefunction(loop._admit)

    def record() -> None:
        with lock:
            admitted.append(time.perf_counter())

    async def ask_async(member) -> None:
        with contextlib.suppress(Stopped):
            while not loop.stop.is_set():
                await loop._admit(member)
                record()

    def ask(member) -> None:
        with contextlib.suppress(Stopped):
            while not loop.stop.is_set():
                loop._admit(member)
                record()

    for member in loop.fleet.members():
        if on_loop:
            loop._streams.submit(ask_async(member))
        else:
            threading.Thread(target=ask, args=(member,), daemon=True).start()
    time.sleep(2.0)  # every member waits (a bench, not a test: a settle time is enough)
    latencies: list[float] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for burst in range(1, args.bursts + 1):
        with lock:
            admitted.clear()
        with loop._cond:
            began = time.perf_counter()
            loop._rollout_version = burst
            loop._wake()
        deadline = time.monotonic() + 60
        while len(admitted) < args.members and time.monotonic() < deadline:
            time.sleep(0.001)
        with lock:
            latencies += [t - began for t in admitted]
        time.sleep(0.5)  # the members wait again
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    loop.stop.set()
    loop._wake()
    latencies.sort()
    pick = lambda q: round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)  # noqa: E731
    print(json.dumps({"members": args.members, "bursts": args.bursts, "admissions": len(latencies),
                      "on_event_loop": on_loop, "admission_ms_p50": pick(0.5), "admission_ms_p99": pick(0.99),
                      "admission_ms_max": pick(1.0), "cpu_s": round(cpu_s, 3), "wall_s": round(wall_s, 3)}))


if __name__ == "__main__":
    main()
