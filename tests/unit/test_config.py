"""Job config: embedded defaults, YAML files, dotted overrides, and errors that name the key."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.config import JobConfig, load_config
from rlfleet.overrides import parse_override
from rlfleet.errors import ConfigError

pytestmark = pytest.mark.unit


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_validate_without_a_file():
    cfg = load_config()
    assert isinstance(cfg, JobConfig)
    assert cfg == JobConfig()
    assert cfg.rollout.n >= 2
    assert cfg.controller.max_staleness >= 0


def test_yaml_file_and_dotted_overrides(tmp_path):
    path = write(tmp_path, "run:\n  name: exp1\nlearner:\n  lr: 0.01\nalgorithm:\n  kl_coef: 0.1\n"
                 "rollout:\n  n: 4\n")
    cfg = load_config(path, ["learner.lr=1e-6", "rollout.stop=[a, b]", "controller.max_staleness=2"])
    assert cfg.run.name == "exp1"
    # `1e-6` is not a YAML float (YAML wants 1.0e-6); it must still arrive as the float 1e-6.
    assert isinstance(cfg.learner.lr, float) and cfg.learner.lr == pytest.approx(1e-6)
    assert cfg.algorithm.kl_coef == pytest.approx(0.1)  # from the file, untouched by overrides
    assert cfg.rollout.stop == ["a", "b"]
    assert cfg.rollout.n == 4
    assert cfg.controller.max_staleness == 2 and isinstance(cfg.controller.max_staleness, int)


def test_override_beats_file_and_later_override_wins(tmp_path):
    path = write(tmp_path, "learner:\n  lr: 0.01\n")
    cfg = load_config(path, ["learner.lr=0.5", "learner.lr=0.25"])
    assert cfg.learner.lr == pytest.approx(0.25)


def test_overrides_apply_without_a_file():
    cfg = load_config(None, ["rollout.n=3", "data.shuffle=false", "run.name=x"])
    assert cfg.rollout.n == 3 and cfg.data.shuffle is False and cfg.run.name == "x"


def test_parse_override_values():
    assert parse_override("a.b=1") == (["a", "b"], 1)
    assert parse_override("a.b=true") == (["a", "b"], True)
    assert parse_override("a.b=[x, y]") == (["a", "b"], ["x", "y"])
    assert parse_override("a.b=") == (["a", "b"], "")


@pytest.mark.parametrize("override, key", [
    ("foo.bar=1", "foo"),
    ("learner.lrr=1e-6", "learner.lrr"),
    ("rollout.sampling.temperature=1", "rollout.sampling"),
])
def test_unknown_key_override_names_the_dotted_key(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert repr(key) in str(info.value) or key in str(info.value)
    assert "unknown" in str(info.value)


def test_unknown_key_in_file_names_the_dotted_key(tmp_path):
    with pytest.raises(ConfigError, match=r"learner\.colour"):
        load_config(write(tmp_path, "learner:\n  colour: blue\n"))
    with pytest.raises(ConfigError, match=r"'trainer'"):
        load_config(write(tmp_path, "trainer:\n  lr: 1\n", "top.yaml"))


@pytest.mark.parametrize("override, key, value", [
    ("learner.lr=-1", "learner.lr", "-1"),
    ("rollout.n=abc", "rollout.n", "abc"),
    ("rollout.top_p=1.5", "rollout.top_p", "1.5"),
    ("run.log_level=loud", "run.log_level", "loud"),
])
def test_bad_value_names_key_and_value(override, key, value):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    assert key in msg and value in msg


def test_cross_field_rule_is_a_config_error():
    with pytest.raises(ConfigError, match=r"rollout\.n"):
        load_config(None, ["rollout.n=1"])


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        load_config(None, ["learner.lr=-1"])


@pytest.mark.parametrize("override", ["learner.lr", "=3", "learner..lr=1", ".lr=1", "learner.=1"])
def test_malformed_override(override):
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, [override])


def test_override_through_a_scalar_is_an_error():
    with pytest.raises(ConfigError, match="name"):
        load_config(None, ["run.name.first=x"])


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(missing)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_non_mapping_yaml(tmp_path, text):
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, text))


def test_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "learner: [unclosed\n"))


def test_empty_file_gives_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == JobConfig()


def test_to_yaml_round_trip(tmp_path):
    cfg = load_config(None, ["learner.lr=1e-6", "rollout.stop=[a, b]", "controller.max_staleness=2",
                             "learner.betas=[0.8, 0.95]", "data.train_files=[x.parquet]"])
    again = load_config(write(tmp_path, cfg.to_yaml()))
    assert again == cfg
    assert again.to_yaml() == cfg.to_yaml()


def test_prompts_per_request_fills_a_replica_batch_by_default():
    from rlfleet.config import load_config

    assert load_config(None, []).controller.prompts_per_request == 8  # 8 prompts per step, 256 // 8 = 32
    big = ["controller.prompts_per_step=64", "rollout.n=16", "rollout.max_batch_sequences=512"]
    assert load_config(None, big).controller.prompts_per_request == 32  # 512 // 16
    assert load_config(None, ["controller.prompts_per_step=32", "rollout.replicas=2"]).controller \
        .prompts_per_request == 16  # one request per replica
    assert load_config(None, ["controller.prompts_per_request=3"]).controller.prompts_per_request == 3


def test_micro_batch_tokens_default_follows_the_device():
    # CPU: a quarter of the activation memory at the same speed (bench/RESULTS.md, issue 26); GPU: 4096
    learner = load_config(None, []).learner
    assert learner.micro_batch_tokens is None
    assert [learner.micro_batch_tokens_on(on_gpu=gpu) for gpu in (False, True)] == [1024, 4096]
    chosen = load_config(None, ["learner.micro_batch_tokens=8192"]).learner
    assert [chosen.micro_batch_tokens_on(on_gpu=gpu) for gpu in (False, True)] == [8192, 8192]
