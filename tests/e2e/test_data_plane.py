"""`controller.data_plane=flight` (issue 44): the same seeded synchronous job, run once with the token
payloads through the controller (inline, the default) and once on the data plane (each rollout replica
holds them on an Arrow Flight server, the learner fetches them), trains bit-identically; the learner's
log shows a fetch a step on flight and none inline."""
from __future__ import annotations

import pytest

from tests.e2e.conftest import read_jsonl, rlfleet

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
