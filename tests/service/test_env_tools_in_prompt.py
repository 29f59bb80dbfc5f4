"""The tools an environment server describes reach the episode prompts over real gRPC: the
controller's prompt loading (`prepare_data`, training and validation prompts) asks the server at
env.address, and env.tools_in_prompt turns it off or insists on it."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from controller.main import prepare_data
from rlfleet.app.env_sdk import Environment, Step, ToolSpec, serve
from rlfleet.config import load_config
from rlfleet.data.tasks import make_rows
from rlfleet.errors import ConfigError

pytestmark = pytest.mark.service

SHORT = ["rollout.max_new_tokens=16", "data.max_prompt_length=240"]  # room in the tiny model's 256 tokens


class Adder(Environment):
    name = "adder"
    tools = (ToolSpec("add", "", {"type": "object", "properties": {"a": {}, "b": {}}}),)

    def start(self, row):
        return {}

    def step(self, state, action):
        return Step(done=True)


class Toolless(Adder):
    tools = ()


def test_the_described_tools_are_in_every_training_and_validation_prompt(tmp_path):
    val = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist(make_rows(4, seed=5, split="test")), val)
    with serve(Adder(), block=False) as server:
        cfg = load_config(overrides=[f"env.address={server.address}", f"run.output_dir={tmp_path}", *SHORT,
                                     f"data.val_files=[{val}]", "controller.eval_every=5"])
        data = prepare_data(cfg)
    call = '<tool_call>{"name": "add", "arguments": {"a": "..."}}</tool_call>'
    for prompt in [*data.source.prompts, *data.evaluator.prompts]:
        assert prompt.text.startswith(f"<|im_start|>system\nTools:\nadd(a, b)\nTo call one, write {call} "), \
            prompt.text
        assert "<|im_start|>user\nReverse the digits: " in prompt.text
    assert len(data.evaluator.prompts) == 4


def test_tools_in_prompt_false_leaves_the_prompts_alone_and_true_insists(tmp_path):
    with serve(Adder(), block=False) as server:
        cfg = load_config(overrides=[f"env.address={server.address}", f"run.output_dir={tmp_path}", *SHORT,
                                     "env.tools_in_prompt=false"])
        data = prepare_data(cfg)
    assert all(p.text.startswith("<|im_start|>user\n") for p in data.source.prompts)
    with serve(Toolless(), block=False) as server:
        overrides = [f"env.address={server.address}", f"run.output_dir={tmp_path}", *SHORT]
        plain = prepare_data(load_config(overrides=overrides)).source.prompts[0].text
        assert plain.startswith("<|im_start|>user")
        with pytest.raises(ConfigError, match=f"env.tools_in_prompt=true, but the environment at "
                                              f"{server.address} describes no tools"):
            prepare_data(load_config(overrides=[*overrides, "env.tools_in_prompt=true"]))
