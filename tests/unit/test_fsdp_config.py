"""learner.world_size: what the config and the launcher accept (the training itself is in
test_fsdp_equivalence.py and tests/e2e/test_fsdp_learner.py)."""
from __future__ import annotations

import pytest

from rlfleet.config import load_config
from rlfleet.errors import ConfigError
from services.learner.distributed import init_learner_world

pytestmark = pytest.mark.unit


def test_world_size_is_validated() -> None:
    assert load_config(None, []).learner.world_size == 1
    with pytest.raises(ConfigError, match="learner.world_size"):
        load_config(None, ["learner.world_size=0"])
    with pytest.raises(ConfigError, match="learner.world_size > 1 does not support learner.lora"):
        load_config(None, ["learner.world_size=2", "learner.lora.rank=4"])


def test_sharded_learner_needs_torchrun_with_the_right_size(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match="needs torchrun"):
        init_learner_world(2, "cpu", 0, timeout_s=5)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match="torchrun started 3 processes"):
        init_learner_world(2, "cpu", 0, timeout_s=5)



def test_the_data_plane_serves_a_sharded_learner_too() -> None:
    # rank 0 fills the batch from the data plane before it is broadcast to the other ranks
    cfg = load_config(None, ["learner.world_size=2", "controller.data_plane=flight"])
    assert (cfg.learner.world_size, cfg.controller.data_plane) == (2, "flight")
