"""Multi-turn SFT (rlfleet/data/conversation.py): a two-call conversation's tokens and loss mask, derived
by hand, equal to what the agent loop's own bookkeeping (rlfleet/env/episode.py + chat.py) makes of the
same episode; user traces in verl's and TRL's forms; bad conversations refused naming the row."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlfleet.data import sft
from rlfleet.data.conversation import ConversationRenderer, tool_specs
from rlfleet.env.chat import ObservationRenderer
from rlfleet.env.episode import Episode
from rlfleet.env.tool_prompt import openai_tools
from rlfleet.errors import DataError
from rlfleet.types import TrainSample

pytestmark = pytest.mark.unit

CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluates an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}


def _call(expression: str, as_text: bool = True) -> dict:
    arguments = {"expression": expression}
    return {"id": f"call_{expression}", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps(arguments) if as_text else arguments}}


# What is 12 * 34 + 5? Two calls (12 * 34 -> 408, 408 + 5 -> 413), then the answer.
CONVERSATION = [
    {"role": "user", "content": "What is 12 * 34 + 5?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("12 * 34")]},
    {"role": "tool", "content": "408", "name": "calculator", "tool_call_id": "call_12 * 34"},
    {"role": "assistant", "content": "", "tool_calls": [_call("408 + 5", as_text=False)]},
    {"role": "tool", "content": "413", "name": "calculator", "tool_call_id": "call_408 + 5"},
    {"role": "assistant", "content": "12 * 34 = 408\n408 + 5 = 413\n#### 413"},
]
CALL_1 = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>'
CALL_2 = '<tool_call>{"name": "calculator", "arguments": {"expression": "408 + 5"}}</tool_call>'
ANSWER = "12 * 34 = 408\n408 + 5 = 413\n#### 413"


@pytest.fixture(scope="module")
def tok():
    from rlfleet.models.tiny import build_tokenizer

    return build_tokenizer()  # ChatML, eos <|im_end|>; no tools in its template: the system-message way


def _runs(tok, ids: list[int], mask: list[int]) -> list[tuple[int, str]]:
    """(mask, text) of each run of equal mask values."""
    runs: list[tuple[int, list[int]]] = []
    for i, m in zip(ids, mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(i)
        else:
            runs.append((m, [i]))
    return [(m, tok.decode(r)) for m, r in runs]


def test_two_call_conversation_mask_by_hand(tok):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rendered = ConversationRenderer(tok, [eos]).render(CONVERSATION, [CALC])
    prompt = tok.decode(rendered.prompt_ids)
    # the prompt as the rollout renders it: the tools' system message, the user, the generation prompt
    assert prompt.startswith("<|im_start|>system\nTools:\ncalculator(expression): Evaluates an arithmetic")
    assert prompt.endswith("<|im_start|>user\nWhat is 12 * 34 + 5?<|im_end|>\n<|im_start|>assistant\n")
    # by hand: each assistant turn with its end-of-turn token is trained on (1); each tool result, with
    # the template's text around it up to the next generation prompt, is shown only (0)
    assert _runs(tok, rendered.response_ids, rendered.response_mask) == [
        (1, CALL_1 + "<|im_end|>"),
        (0, "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"),
        (1, CALL_2 + "<|im_end|>"),
        (0, "\n<|im_start|>tool\n413<|im_end|>\n<|im_start|>assistant\n"),
        (1, ANSWER + "<|im_end|>"),
    ]
    # token counts: each trained run is its text's tokens plus one end-of-turn token
    ones = sum(rendered.response_mask)
    assert ones == sum(len(tok(t, add_special_tokens=False)["input_ids"]) + 1
                       for t in (CALL_1, CALL_2, ANSWER))
    assert len(rendered.response_mask) == len(rendered.response_ids)
    # the whole token sequence is the chat template's rendering of the conversation (calls as text)
    as_text = [{"role": m["role"], "content": {1: CALL_1, 3: CALL_2}.get(k, m["content"])}
               for k, m in enumerate(CONVERSATION)]
    tools_system = prompt[len("<|im_start|>system\n"):prompt.index("<|im_end|>")]
    full = tok.apply_chat_template([{"role": "system", "content": tools_system}, *as_text], tokenize=False)
    assert tok.decode(rendered.prompt_ids + rendered.response_ids) + "\n" == full


def test_the_agent_loops_bookkeeping_makes_the_same_tokens_and_mask(tok):
    """The episode the agent loop records when the model writes these turns and the calculator answers."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rendered = ConversationRenderer(tok, [eos]).render(CONVERSATION, [CALC])
    renderer = ObservationRenderer(tok)
    from rlfleet.env.types import Message, Observation

    def replay(stop_at_call: bool) -> Episode:
        episode = Episode("e/0", rendered.prompt_ids, budget_tokens=1000)
        for text, result in ((CALL_1, "408"), (CALL_2, "413"), (ANSWER, None)):
            ended = result is None or not stop_at_call  # rollout.stop=['</tool_call>'] ends a call turn there
            ids = renderer.ids(text) + ([eos] if ended else [])
            episode.add_turn(ids, [-0.5] * len(ids), 0, 0, text, "stop")
            if result is not None:
                obs = Observation(messages=(Message("tool", result, "calculator"),))
                episode.add_observation(renderer.ids(renderer.text(obs, ended)), "")
        return episode

    episode = replay(stop_at_call=False)
    assert episode.token_ids == rendered.response_ids and episode.loss_mask == rendered.response_mask
    stopped = replay(stop_at_call=True)  # the same tokens; the end-of-turn after a call comes as context
    assert stopped.token_ids == rendered.response_ids
    differs = [k for k, (a, b) in enumerate(zip(stopped.loss_mask, rendered.response_mask)) if a != b]
    assert [rendered.response_ids[k] for k in differs] == [eos, eos]


def test_sft_loads_conversations_with_their_mask_and_trains_only_on_assistant_tokens(tok, tmp_path):
    rows = [{"messages": CONVERSATION, "tools": json.dumps([CALC])},  # TRL keeps tools as JSON text
            {"messages": [{"role": "user", "content": "What is 2 + 3?"},
                          {"role": "assistant", "content": "#### 5"}], "tools": None}]
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    examples, too_long = sft.load_examples([path], tok, "prompt", "extra_info.answer", 4096, [eos])
    assert too_long == 0 and len(examples) == 2
    first = ConversationRenderer(tok, [eos]).render(CONVERSATION, [CALC])
    assert examples[0].response_mask == first.response_mask and examples[0].prompt_ids == first.prompt_ids
    # no tools: no system message; a one-turn conversation is all trained on
    assert tok.decode(examples[1].prompt_ids) == ("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
                                                  "<|im_start|>assistant\n")
    assert examples[1].response_mask == [1] * len(examples[1].response_ids)
    from rlfleet.app.sft_trainer import sft_samples

    samples = sft_samples(examples, 0)
    assert isinstance(samples[0], TrainSample) and samples[0].loss_mask == first.response_mask
    # too long for the limit: left out and counted
    _, too_long = sft.load_examples([path], tok, "prompt", "extra_info.answer", 40, [eos])
    assert too_long == 1


def test_verl_parquet_traces_with_struct_columns(tok, tmp_path):
    """verl's multi-turn SFT parquet: `messages` and `tools` as nested columns (arguments as JSON text)."""
    messages = CONVERSATION[:3] + [{"role": "assistant", "content": "#### 413"}]
    table = pa.Table.from_pylist([{"messages": messages, "tools": [CALC]}])
    pq.write_table(table, tmp_path / "verl.parquet")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    examples, _ = sft.load_examples([tmp_path / "verl.parquet"], tok, "prompt", "extra_info.answer", 4096,
                                    [eos])
    assert _runs(tok, examples[0].response_ids, examples[0].response_mask) == [
        (1, CALL_1 + "<|im_end|>"), (0, "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"),
        (1, "#### 413<|im_end|>")]


def test_tool_specs_in_every_accepted_form():
    specs = tool_specs([CALC])
    assert specs == tool_specs(json.dumps([CALC])) == tool_specs([CALC["function"]])
    assert openai_tools(specs) == [CALC]
    assert tool_specs(None) == ()


@pytest.mark.parametrize("messages,needle", [
    ([{"role": "user", "content": "hi"}], "no assistant message"),
    (CONVERSATION[:3], "the last message is a 'tool' message"),
    ([{"role": "assistant", "content": "x"}], "starts with the assistant"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
      "tool_calls": [{"function": {"name": "calculator", "arguments": "{oops"}}]}], "arguments are not JSON"),
    ([{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}], "content of type int"),
])
def test_bad_conversations_are_refused_naming_the_row(tok, tmp_path, messages, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    with pytest.raises(DataError, match=needle) as err:
        sft.load_examples([path], tok, "prompt", "extra_info.answer", 4096, [tok.eos_token_id])
    assert "bad.jsonl, row 0" in str(err.value)
