"""RLFLEET_PROFILE_STEPS / RLFLEET_PROFILE_DIR: which calls are traced, and what a trace leaves behind."""
import gzip
import json

import pytest
import torch

from rlfleet.profiling import StepProfiler, parse_steps

pytestmark = pytest.mark.unit


def test_steps_parse_and_bad_entries_are_named():
    assert parse_steps("8, 9,,") == {8, 9}
    assert parse_steps("") == frozenset()
    with pytest.raises(ValueError, match="'x'"):
        parse_steps("3,x")
    with pytest.raises(ValueError, match="'0'"):
        parse_steps("0")


def test_only_the_named_calls_are_traced(tmp_path):
    prof = StepProfiler("learner", {"RLFLEET_PROFILE_STEPS": "2", "RLFLEET_PROFILE_DIR": str(tmp_path)})
    for step in (1, 2, 3):
        with prof.trace(step):
            torch.ones(64, 64) @ torch.ones(64, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learner-2.json.gz", "learner-2.txt"]
    text = (tmp_path / "learner-2.txt").read_text()
    assert text.startswith("learner call 2:") and "aten::mm" in text
    trace = json.loads(gzip.open(tmp_path / "learner-2.json.gz").read())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])


def test_unset_traces_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prof = StepProfiler("rollout", {})
    with prof.trace(prof.next_call()):
        pass
    assert prof.calls == 1 and list(tmp_path.iterdir()) == []
