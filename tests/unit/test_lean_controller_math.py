"""The controller's torch-free pieces agree with the torch versions they replace there:
plain-list group advantages (rlfleet.advantages.group_lists) and the prompt tokenizer
(rlfleet.models.prompt_tokenizer) against transformers' AutoTokenizer."""
from __future__ import annotations

import random

import pytest

from rlfleet.advantages import group, group_lists

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("seed", range(20))
def test_group_advantages_on_lists_match_the_torch_ones(seed: int) -> None:
    rng = random.Random(seed)
    rewards = [rng.choice([0.0, 0.25, 1.0, rng.random()]) for _ in range(rng.randint(0, 9))]
    for normalize in (True, False):
        want = group.group_advantages(rewards, normalize_std=normalize).tolist()
        got = group_lists.group_advantages(rewards, normalize_std=normalize)
        assert got == pytest.approx(want, abs=1e-5)
    want_rloo = group.rloo_advantages(rewards).tolist()
    assert group_lists.rloo_advantages(rewards) == pytest.approx(want_rloo, abs=1e-5)


def test_group_advantages_on_lists_keep_the_conventions() -> None:
    # [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866
    assert group_lists.group_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([0.866, -0.866, -0.866, 0.866],
                                                                               abs=1e-3)
    assert group_lists.group_advantages([0.3] * 5) == [0.0] * 5  # all equal: exactly 0
    assert group_lists.group_advantages([2.0]) == [0.0]
    assert group_lists.rloo_advantages([1.0, 0.0]) == [1.0, -1.0]  # r_i minus the other one
    with pytest.raises(ValueError, match="non-finite"):
        group_lists.group_advantages([1.0, float("nan")])


def test_the_prompt_tokenizer_renders_and_counts_as_auto_tokenizer(tmp_path) -> None:
    from transformers import AutoTokenizer

    from rlfleet.data import tasks
    from rlfleet.models.prompt_tokenizer import PromptTokenizer, load_prompt_tokenizer
    from rlfleet.models.tiny import ensure_tiny_model

    model_dir = ensure_tiny_model()
    light, full = load_prompt_tokenizer(model_dir), AutoTokenizer.from_pretrained(model_dir)
    assert isinstance(light, PromptTokenizer) and light.chat_template == full.chat_template
    conversations = [row["prompt"] for row in tasks.make_rows(20, seed=3)]
    conversations.append([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Reverse the digits: 90210 and say ok"}])
    for messages in conversations:
        text = light.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == full.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        want_ids = full(text, add_special_tokens=False)["input_ids"]
        assert light(text, add_special_tokens=False)["input_ids"] == want_ids


def test_a_template_that_uses_the_special_tokens_sees_them(tmp_path) -> None:
    from transformers import AutoTokenizer

    from rlfleet.models.prompt_tokenizer import load_prompt_tokenizer
    from rlfleet.models.tiny import ensure_tiny_model

    full = AutoTokenizer.from_pretrained(ensure_tiny_model())
    full.chat_template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
                          "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    full.save_pretrained(tmp_path)
    light = load_prompt_tokenizer(tmp_path)
    messages = [{"role": "user", "content": "Reverse the digits: 123"}]
    want = full.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert want.startswith(full.bos_token)
    assert light.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == want


def test_a_folder_without_tokenizer_json_falls_back_to_transformers(tmp_path) -> None:
    from rlfleet.models.prompt_tokenizer import read_prompt_tokenizer

    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert read_prompt_tokenizer(tmp_path) is None


def test_generation_blocks_loop_controls_and_tojson_render_as_in_transformers(tmp_path) -> None:
    from transformers import AutoTokenizer

    from rlfleet.models.prompt_tokenizer import load_prompt_tokenizer
    from rlfleet.models.tiny import ensure_tiny_model

    full = AutoTokenizer.from_pretrained(ensure_tiny_model())
    full.chat_template = (
        "{%- for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
        "  {{ m['role'] }}: {{ m['content'] | tojson }}\n"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    full.save_pretrained(tmp_path)
    light = load_prompt_tokenizer(tmp_path)
    messages = [{"role": "system", "content": "hidden"}, {"role": "user", "content": "a <b> & \"c\" é"},
                {"role": "assistant", "content": "42"}, {"role": "user", "content": "again"}]
    want = full.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "hidden" not in want and "<b>" in want
    assert light.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == want
