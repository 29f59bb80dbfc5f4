"""`controller.data_plane=flight` (issue 44): the same seeded synchronous job, run once with the token
payloads through the controller (inline, the default) and once on the data plane (each rollout replica
holds them on an Arrow Flight server and pushes them to the learner's staging store, the learner trains
from it or fetches what is not staged), trains bit-identically; the learner's log shows the payloads
resolved once a step on flight and never inline; on flight behind mutual TLS and the token too."""
from __future__ import annotations

import pytest

from tests.e2e.conftest import read_jsonl, rlfleet
from tests.tls_certs import make_pki, secure_job_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 3


def _run(run_dir, plane: str) -> list[dict]:
    proc = rlfleet("run", f"run.output_dir={run_dir}", f"run.name={plane}", f"controller.max_steps={STEPS}",
                   "controller.max_staleness=0", f"controller.data_plane={plane}",
                   "learner.verify_weights=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_jsonl(run_dir / plane / "metrics.jsonl")


def test_flight_trains_bit_identically_to_inline(run_dir):
    inline, flight = _run(run_dir, "inline"), _run(run_dir, "flight")
    assert [m["step"] for m in flight] == list(range(1, STEPS + 1))
    for a, b in zip(inline, flight, strict=True):
        same = {k: v for k, v in a.items() if not k.startswith(("timing/", "perf/"))}
        assert {k: b.get(k) for k in same} == same  # rewards, losses, lengths, versions, token counts
    resolved = (run_dir / "flight" / "logs" / "learner.log").read_text().count("data plane resolved")
    assert resolved == STEPS
    assert "data plane resolved" not in (run_dir / "inline" / "logs" / "learner.log").read_text()


def test_flight_behind_mutual_tls_and_the_token(run_dir, tmp_path):
    """Every channel and the data plane with the fleet's certificates and token: the replica pushes
    every step's payloads to the learner's staging Flight server, and the learner fetches what is not
    staged from the replica's, over mutual TLS with the token (a caller without either is refused:
    tests/service/test_dataplane_flight.py); pushes that failed would be counted and logged."""
    pki = make_pki(tmp_path / "pki")
    config = secure_job_config(tmp_path, pki, "e2e-data-plane-token-0123456789")
    proc = rlfleet("run", "--config", str(config), f"run.output_dir={run_dir}", "run.name=secure",
                   f"controller.max_steps={STEPS}", "controller.data_plane=flight")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [m["step"] for m in read_jsonl(run_dir / "secure" / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert (run_dir / "secure" / "logs" / "learner.log").read_text().count("data plane resolved") == STEPS
    rollout_log = (run_dir / "secure" / "logs" / "rollout.log").read_text()
    assert "data plane push to the learner failed" not in rollout_log
