"""Unknown config keys say what was meant (issue 32, from a new user): a close rlfleet key, or for a
verl key its rlfleet name, from one table that docs/from-verl.md shows."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlfleet.config import known_keys, load_config
from rlfleet.config_hints import VERL_KEYS
from rlfleet.errors import ConfigError

pytestmark = [pytest.mark.unit]
REPO = Path(__file__).resolve().parents[2]


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(None, list(overrides))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_verl_key_names_its_rlfleet_key():
    message = _error("actor_rollout_ref.actor.optim.lr=1e-6")
    assert "'actor_rollout_ref.actor.optim.lr': verl's name for learner.lr" in message, message
    assert "docs/from-verl.md" in message
    assert "controller.prompts_per_step" in _error("data.train_batch_size=64")


def test_several_verl_keys_in_one_section_are_named_together():
    message = _error("actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.rollout.n=8")
    assert "actor_rollout_ref.actor.optim.lr is learner.lr" in message
    assert "actor_rollout_ref.rollout.n is rollout.n" in message, message


def test_verls_multi_turn_keys_point_to_the_environment():
    # verl configures tools with a YAML file (multi_turn.tool_config_path); rlfleet asks an environment
    message = _error("actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml")
    assert "verl's name for env.name" in message, message
    # multi_turn.enable beside a mapped key was left out of the message: both are named
    message = _error("actor_rollout_ref.rollout.multi_turn.enable=true",
                     "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3")
    assert "actor_rollout_ref.rollout.multi_turn.enable is env.name" in message, message
    assert "actor_rollout_ref.rollout.multi_turn.max_assistant_turns is rollout.max_turns" in message, message


def test_verl_keys_without_an_rlfleet_name_are_named_beside_the_mapped_ones():
    message = _error("actor_rollout_ref.actor.optim.lr=1e-6",
                     "actor_rollout_ref.actor.use_torch_compile=true")
    assert "actor_rollout_ref.actor.optim.lr is learner.lr" in message, message
    assert "no rlfleet key for actor_rollout_ref.actor.use_torch_compile" in message, message


@pytest.mark.parametrize(("key", "meant"), [("learner.lrr", "learner.lr"), ("rollout.lr", "learner.lr"),
                                            ("rollout.temprature", "rollout.temperature"),
                                            ("controler", "controller")])
def test_a_typo_or_a_key_in_the_wrong_section_gets_did_you_mean(key, meant):
    assert f"did you mean {meant!r}?" in _error(f"{key}=1")


def test_a_key_like_nothing_gets_no_guess():
    message = _error("learner.zzzzzz=1")
    assert message.endswith("unknown config key 'learner.zzzzzz'"), message


def test_every_rlfleet_key_of_the_table_exists():
    known = set(known_keys())
    for verl, ours in VERL_KEYS.items():
        named = re.findall(r"[a-z_]+(?:\.[a-z_]+)+", ours)
        assert named and set(named) <= known, (verl, ours)


def test_the_docs_table_is_the_table():
    text = (REPO / "docs" / "from-verl.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.+) \|$", text, re.MULTILINE))
    assert set(rows) == set(VERL_KEYS)
    for verl, ours in VERL_KEYS.items():
        assert rows[verl].replace("`", "") == ours, (verl, rows[verl])
