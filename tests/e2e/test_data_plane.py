"""`controller.data_plane=flight` (issue 44): the same seeded synchronous job, run once with the token
payloads through the controller (inline, the default) and once on the data plane (each rollout replica
holds them on an Arrow Flight server, the learner fetches them), trains bit-identically; the learner's
log shows a fetch a step on flight and none inline; on flight behind mutual TLS and the token too."""
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
    fetches = (run_dir / "flight" / "logs" / "learner.log").read_text().count("data plane fetched")
    assert fetches == STEPS
    assert "data plane fetched" not in (run_dir / "inline" / "logs" / "learner.log").read_text()


def test_flight_behind_mutual_tls_and_the_token(run_dir, tmp_path):
    """Every channel and the data plane with the fleet's certificates and token: the learner fetches
    every step's payloads from the replica's Flight server over mutual TLS with the token (a caller
    without either is refused: tests/service/test_dataplane_flight.py)."""
    pki = make_pki(tmp_path / "pki")
    config = secure_job_config(tmp_path, pki, "e2e-data-plane-token-0123456789")
    proc = rlfleet("run", "--config", str(config), f"run.output_dir={run_dir}", "run.name=secure",
                   f"controller.max_steps={STEPS}", "controller.data_plane=flight")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [m["step"] for m in read_jsonl(run_dir / "secure" / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert (run_dir / "secure" / "logs" / "learner.log").read_text().count("data plane fetched") == STEPS
