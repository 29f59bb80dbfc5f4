"""The committed generated code must match the .proto files."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.proto.generate import OUT_DIR, generate_to

pytestmark = pytest.mark.unit


def test_generated_code_is_fresh(tmp_path: Path):
    pytest.importorskip("grpc_tools")
    fresh = {p.name: p.read_text() for p in generate_to(tmp_path)}
    committed = {p.name: p.read_text() for p in OUT_DIR.glob("*_pb2*.py*")}
    assert set(fresh) == set(committed), "generated files differ: run `make proto`"
    stale = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not stale, f"stale generated code, run `make proto`: {stale}"
