"""Config values found wrong when the config is read, in one line (issue 22)."""
from __future__ import annotations

import pytest

from rlfleet.config import load_config
from rlfleet.errors import ConfigError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("override, key", [
    ("rollout.address=127.0.0.1:notaport", "rollout.address"),
    ("learner.address=127.0.0.1:70000", "learner.address"),
    ("reward.address=localhost", "reward.address"),
    ("rollout.addresses=[127.0.0.1:5000, 127.0.0.1:x]", "rollout.addresses"),
])
def test_an_address_that_cannot_be_reached_is_refused_at_config_time(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert key in str(err.value) and ("port" in str(err.value) or "host:port" in str(err.value)), err.value


def test_good_addresses_pass():
    cfg = load_config(None, ["rollout.address=10.0.0.5:50051", "learner.address='[::1]:6000'",
                             "rollout.addresses=[h1:1, h2:2]"])
    assert cfg.rollout.address == "10.0.0.5:50051" and cfg.learner.address == "[::1]:6000"


def test_invalid_yaml_is_one_line_without_the_caret(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("learner:\n  lr: 1e-6\n  grad_clip: [1.0\ncontroller:\n  max_steps: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad, [])
    message = str(err.value)
    assert "\n" not in message and "^" not in message, message
    assert str(bad) in message and "line" in message, message
