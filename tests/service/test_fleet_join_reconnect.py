"""A replica started before its controller (`rlfleet serve rollout --join`, a Slurm rollout job that
starts first) reaches the controller within seconds of it listening, however long it was refused
before: gRPC's own reconnect backoff (growing to 120 s) must not outlast the join's 1 s retries.
Seen in the fleet e2e test: a joiner still refused 7 s after the controller listened."""
from __future__ import annotations

import threading
import time

import pytest

from controller.status_servicer import start_status_server
from rlfleet.app.fleet_member import FleetMembership
from rlfleet.rpc.security import Security
from tests.free_ports import port_for_later

pytestmark = [pytest.mark.service, pytest.mark.slow, pytest.mark.timeout(120)]

# Long enough for gRPC's default backoff (1 s x 1.6 per attempt, 20 % jitter) to space its attempts
# ~17 s apart (one near 26 s, the next near 43 s): a channel left with it reaches the controller
# ~9-17 s after it listens, while the join's own retries (1 s apart, 1 s backoff at most) take ~2 s.
REFUSED_S = 30.0
SOON_S = 5.0


def test_a_joiner_refused_for_a_while_reaches_the_controller_soon_after_it_listens(tiny_model_dir):
    port = port_for_later()  # bound REFUSED_S later: parallel tests must not take it meanwhile
    member = FleetMembership(f"127.0.0.1:{port}", Security(), "early", tiny_model_dir, wait_s=REFUSED_S + 30)
    joining = threading.Thread(target=lambda: _join_until_stopped(member), daemon=True)
    joining.start()
    time.sleep(REFUSED_S)  # refused all along: nothing listens
    contacts: list[float] = []

    def still_starting():
        """The controller's loop is not built yet: every Join is told to come back (UNAVAILABLE)."""
        contacts.append(time.monotonic())
        return None
    listening_at = time.monotonic()
    server = start_status_server("127.0.0.1", port, "run", {}, still_starting)
    try:
        deadline = listening_at + 30
        while not contacts and time.monotonic() < deadline:
            time.sleep(0.05)
        assert contacts, "the joiner never reached the controller"
        late_s = contacts[0] - listening_at
        assert late_s < SOON_S, f"first Join {late_s:.1f}s after the controller listened"
    finally:
        server.stop(grace_s=0)
        member.close()


def _join_until_stopped(member: FleetMembership) -> None:
    try:
        member.join("127.0.0.1:1")
    except Exception:  # noqa: BLE001 - the channel is closed under it at the end of the test
        pass
