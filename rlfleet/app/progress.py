"""The console's line per step under `rlfleet run` and `rlfleet controller`.

Each step: reward, loss, KL, entropy, staleness, throughput, weight sync, the step's time and an ETA
(the mean wall time of the last steps, evaluations and checkpoints included, times the steps left);
with an environment the turns and tool calls per episode and the share of tool calls that failed.
A step on which every group gave all its samples one reward (no signal: zero advantages, pg_loss 0,
the policy does not move) says so with the count; when that lasts NO_SIGNAL_STREAK steps in a row a
line says the run is not learning and what to look at, once per streak; the run's end counts them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

NO_SIGNAL_STREAK = 5  # steps in a row without signal before the run is said not to learn
ETA_WINDOW = 10  # steps the ETA averages over


def duration(seconds: float) -> str:
    """42s, 4m10s, 2h05m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_progress(m: dict[str, Any], max_steps: int) -> str:
    """The step's numbers, without the timing StepProgress adds."""
    return (f"step {m['step']:>4}/{max_steps} | v{m['policy_version']:<4} | reward {m['reward/mean']:.3f} "
            f"| pg_loss {m['actor/pg_loss']:+.4f} | kl {m['actor/kl_loss']:.4f} | entropy "
            f"{m['actor/entropy']:.3f} "
            f"| staleness {m['staleness/mean']:.2f}/{m['staleness/max']:.0f} | "
            f"{m['perf/tokens_per_s']:.0f} tok/s "
            f"| sync {m['timing/weight_sync_s'] * 1000:.0f} ms"
            + (f" | no reward: {m['reward/excluded_total']:.0f} samples so far"
               if m.get("reward/excluded_total")
               else ""))


def episode_part(m: dict[str, Any]) -> str:
    """Turns and tool calls per episode and the tool-error rate ('' for a single-turn step)."""
    if "env/turns_mean" not in m:
        return ""
    calls, errors = m.get("env/tool_calls", 0.0), m.get("env/tool_errors", 0.0)
    rate = f"{100 * errors / calls:.0f}%" if calls else "- (no calls)"
    return (f" | turns {m['env/turns_mean']:.2f} | tools {m.get('env/tool_calls_per_episode', 0.0):.2f}/ep"
            f" | tool errors {rate}")


def no_signal(m: dict[str, Any]) -> bool:
    """Every trained group gave all its samples one reward."""
    groups = m.get("groups/trained", 0)
    return groups > 0 and m.get("groups/no_signal", 0) == groups


class StepProgress:
    """Lines to print for each step's metrics (`lines`), keeping what the ETA and the no-signal streak
    need. `clock`: seconds, monotonic (time.monotonic; a test passes its own)."""

    def __init__(self, max_steps: int, clock: Callable[[], float] = time.monotonic,
                 run_dir: str | Path = "RUN_DIR"):
        self.max_steps = max_steps
        self.run_dir = run_dir  # named in the not-learning line's command
        self.clock = clock
        self._last_at: float | None = None
        self._seconds: deque[float] = deque(maxlen=ETA_WINDOW)
        self._streak: list[int] = []  # the steps of the current run of steps without signal
        self.steps = 0  # steps seen
        self.flat_steps = 0  # of them, steps without signal

    def _eta(self, m: dict[str, Any]) -> str:
        now = self.clock()
        if self._last_at is None:  # the first step seen: its own time (and its evaluation's)
            self._seconds.append(m.get("timing/step_s", 0.0) + m.get("timing/eval_s", 0.0))
        else:
            self._seconds.append(now - self._last_at)
        self._last_at = now
        left = self.max_steps - int(m["step"])
        if left <= 0:
            return ""
        mean = sum(self._seconds) / len(self._seconds)
        return f" | ETA {duration(mean * left)}"

    def lines(self, m: dict[str, Any]) -> list[str]:
        line = (format_progress(m, self.max_steps) + episode_part(m)
                + f" | {m.get('timing/step_s', 0.0):.2f} s/step" + self._eta(m))
        out = [line]
        self.steps += 1
        if not no_signal(m):
            self._streak = []
            return out
        groups = int(m["groups/trained"])
        out[0] += f" | no signal: {groups}/{groups} groups one reward each"
        self._streak.append(int(m["step"]))
        self.flat_steps += 1
        if len(self._streak) == NO_SIGNAL_STREAK:
            same = (f" (every sample {m['reward/mean']:.3f})" if m.get("reward/std", 1.0) == 0.0 else "")
            out.append(
                f"rlfleet: not learning: no signal for {NO_SIGNAL_STREAK} steps in a row (steps "
                f"{self._streak[0]}-{self._streak[-1]}){same}: every group's samples got the same reward, so "
                "the advantages and pg_loss are 0 and the policy does not change. The task is too hard (all "
                "0) or too easy (all full score) for the model, or the reward never varies (raise rollout.n "
                f"or rollout.temperature?). What it writes: rlfleet samples {self.run_dir} --last 8"
            )
        return out

    def summary(self) -> str | None:
        """A line for the end of the run when some of its steps had no signal, else None."""
        if not self.flat_steps:
            return None
        return (f"rlfleet: {self.flat_steps} of {self.steps} steps had no signal (every group one reward for "
                "all its samples): nothing was learned on them")
