"""Whether the environment can be reached: the controller's environment outage, a small state machine
like the reward outage (controller/reward_outage.py).

    RUNNING --an episode failed 'unavailable'------------> OUTAGE(since, cause); a probe thread starts
    OUTAGE  --the environment's health says SERVING-------> TRIAL: one request is admitted, the clock runs on
    TRIAL   --an episode failed 'unavailable' again-------> OUTAGE (the same outage, the same `since`)
    OUTAGE/TRIAL --an episode got an answer (`reached`)---> RUNNING
    OUTAGE/TRIAL --env.max_outage_s passed----------------> `expired()` names the cause (the run stops)

Health alone never ends an outage: a server whose health says SERVING while every call fails
UNAVAILABLE stops the run after env.max_outage_s, as one that is down does. Episodes that failed so
are left out (their groups are dropped and generated again later, their admission slots given back);
while paused no new prompts are admitted, and a trial admits one request (`take_admission`), not the
gate's worth (issue 42: ~3,500 episodes a minute reached such a server while admission was "paused").
Each failed trial doubles the wait before the next probe (probe_every_s up to max_probe_every_s). One
warning when an outage begins and one when it ends.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from rlfleet.config import JobConfig
from rlfleet.errors import RlfleetError

log = structlog.get_logger(__name__)

RUNNING, OUTAGE, TRIAL = "running", "outage", "trial"


class EnvOutageExpired(RlfleetError, ConnectionError):
    """The environment could not be reached for longer than env.max_outage_s."""


class EnvOutage:
    def __init__(self, max_outage_s: float, probe: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic,
                 probe_every_s: float = 1.0, on_change: Callable[[str, dict], None] | None = None,
                 max_probe_every_s: float = 15.0):
        """`probe()`: True when the environment answers (its health says SERVING)."""
        self.max_outage_s, self.probe, self.clock = max_outage_s, probe, clock
        self.probe_every_s, self.on_change = probe_every_s, on_change
        self.max_probe_every_s = max(max_probe_every_s, probe_every_s)
        self.probe_wait_s = probe_every_s  # before the next probe: doubled by each failed trial
        self._lock = threading.Lock()
        self.state, self.since, self.cause, self.outages = RUNNING, 0.0, "", 0
        self._trial_taken = False  # the trial's one request was admitted
        self._stop = threading.Event()

    def blocked(self) -> bool:
        """Whether admission is paused: during an outage, and in a trial once its request is out."""
        return self.state == OUTAGE or (self.state == TRIAL and self._trial_taken)

    def take_admission(self) -> bool:
        """Called as a request is admitted: True when it may be (always while running; once a trial)."""
        with self._lock:
            if self.state == RUNNING:
                return True
            if self.state == TRIAL and not self._trial_taken:
                self._trial_taken = True
                return True
            return False

    def failed(self, cause: str) -> None:
        with self._lock:
            self.cause = cause
            if self.state == OUTAGE:
                return
            if self.state == TRIAL:  # health said SERVING, the calls say otherwise: pause again
                self.state = OUTAGE
                self.probe_wait_s = min(2 * self.probe_wait_s, self.max_probe_every_s)
                trial = True
            else:
                # Journalled first, then admission pauses: each change is in the journal before
                # admission acts on it (the lock keeps a second failure from telling it again).
                self._tell(OUTAGE, cause=cause[:300])
                self.state, self.since = OUTAGE, self.clock()
                self.outages += 1
                self.probe_wait_s = self.probe_every_s
                trial = False
        if trial:
            log.info(f"environment still unavailable though its health says SERVING: {cause}")
        else:
            log.warning(f"environment outage: {cause}; admission paused; the run stops if this lasts "
                        f"env.max_outage_s={self.max_outage_s:g}s")
        threading.Thread(target=self._probe_until_serving, name="env-probe", daemon=True).start()

    def _probe_until_serving(self) -> None:
        while not self._stop.wait(self.probe_wait_s):
            if self.state != OUTAGE:
                return
            if self.probe():
                with self._lock:
                    if self.state == OUTAGE:
                        # one request is admitted; only an answered episode ends the outage
                        self.state, self._trial_taken = TRIAL, False
                return

    def reached(self) -> None:
        """An episode got an answer from the environment: an outage is over."""
        with self._lock:
            if self.state == RUNNING:
                return
            lasted = self.clock() - self.since
            self._tell(RUNNING, outage_s=round(lasted, 3))  # journalled before admission resumes
            self.state = RUNNING
        log.warning(f"environment outage over after {lasted:.1f}s; admission resumes")

    def expired(self) -> EnvOutageExpired | None:
        """The error that stops the run, once the outage is older than env.max_outage_s."""
        with self._lock:
            if self.state != RUNNING and self.clock() - self.since > self.max_outage_s:
                return EnvOutageExpired(f"no environment for {self.clock() - self.since:.0f}s "
                                        f"(env.max_outage_s={self.max_outage_s:g}): {self.cause}")
        return None

    def status(self) -> tuple[str, float]:
        """(state, seconds the outage has lasted: 0 when running)."""
        with self._lock:
            return self.state, (self.clock() - self.since if self.state != RUNNING else 0.0)

    def close(self) -> None:
        self._stop.set()

    def _tell(self, state: str, **fields) -> None:
        """Called with the lock held, before the state changes: `on_change` must not call back."""
        if self.on_change is not None:
            self.on_change(state, fields)


def env_outage_of(cfg: JobConfig, note: Callable[..., None]) -> EnvOutage | None:
    """The environment outage tracker, probing the environment server's health (None without one)."""
    if not cfg.env.address:
        return None
    note_change = lambda state, fields: note("env_outage" if state == "outage" else "env_back", **fields)  # noqa: E731
    if cfg.env.kind == "openenv":  # an OpenEnv server's health is its GET /health
        from rlfleet.rpc.openenv_wire import endpoint_of, healthy

        endpoint = endpoint_of(cfg.env.address)
        return EnvOutage(cfg.env.max_outage_s, probe=lambda: healthy(endpoint), on_change=note_change)
    from rlfleet.rpc.channel import FAST_RECONNECT, health_status, open_channel
    from rlfleet.rpc.security import Security

    # health needs no token, but a server with TLS answers only a TLS channel; probed every second, so
    # a server that is back is seen within a second, not after gRPC's reconnect backoff (up to 2 min)
    channel = open_channel(cfg.env.address, Security.from_config(cfg.security, cfg.limits), FAST_RECONNECT)
    return EnvOutage(cfg.env.max_outage_s, probe=lambda: health_status(channel) == "SERVING",
                     on_change=note_change)
