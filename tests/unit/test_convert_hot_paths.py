"""The per-group conversions the controller runs for every group (rlfleet/rpc/convert.py,
controller/episodes.py), made cheaper in issue 44 (each object built once): what they produce must not
change. A flight group's completions carry where their tokens wait; a Score request carries each item's
own extra_info even where a group's items share one; an episode is scored on its final turn."""
from __future__ import annotations

import json

import pytest

from controller.episodes import split_group
from rlfleet import types as t
from rlfleet.data.prompts import Prompt
from rlfleet.rpc import convert

pytestmark = pytest.mark.unit


def _completion(i: int, **kw) -> t.Completion:
    return t.Completion([], [], "stop", 3, text=f"answer {i}", last_policy_version=4, **kw)


def test_a_flight_group_says_where_each_samples_tokens_wait():
    completions = [_completion(i, payload=t.PayloadRef("10.0.0.1:7000", "r-9", i, 100 + i)) for i in range(3)]
    msg = convert.group_to_proto(t.GroupResult("r-9", completions, payload_address="10.0.0.1:7000"))
    group = convert.group_from_proto(msg)
    assert group.payload_address == "10.0.0.1:7000"
    assert [c.payload for c in group.completions] == [t.PayloadRef("10.0.0.1:7000", "r-9", i, 100 + i)
                                                      for i in range(3)]
    assert [(c.text, c.policy_version, c.last_policy_version, c.response_tokens) for c in group.completions] \
        == [(f"answer {i}", 3, 4, 100 + i) for i in range(3)]


def test_an_inline_group_has_no_payload_refs():
    completions = [t.Completion([5, 6], [-0.1, -0.2], "length", 2, text="x")]
    group = convert.group_from_proto(convert.group_to_proto(t.GroupResult("r-1", completions)))
    assert group.completions[0].payload is None and list(group.completions[0].token_ids) == [5, 6]


def test_a_score_request_carries_each_items_own_extra_info():
    shared = {"answer": 5}
    items = [t.ScoreItem(f"r/{i}", "digits", "p", "r", "5", extra_info=shared) for i in range(2)]
    items += [t.ScoreItem("s/0", "digits", "q", "r", "7", extra_info={"answer": 7}),
              t.ScoreItem("s/1", "digits", "q", "r", "7")]
    request = convert.score_items_to_proto(items)
    assert [json.loads(i.extra_info_json) if i.extra_info_json else {} for i in request.items] == \
        [{"answer": 5}, {"answer": 5}, {"answer": 7}, {}]
    assert convert.score_items_from_proto(request) == items


def test_split_group_scores_an_episodes_final_turn_and_keeps_the_environments_results():
    prompt = Prompt(0, "the prompt", [1, 2], "calc", "42", extra_info={"k": 1})
    turns = (t.TurnRecord(4, 3, 3, 3, text="call the tool"), t.TurnRecord(2, 0, 3, 3, text="#### 42"))
    completions = [_completion(0, turns=turns), _completion(1, env_reward=0.5),
                   _completion(2, env_failure="timeout", env_error="episode r/2 timed out"), _completion(3)]
    results, to_score = split_group(prompt, completions, "r")
    assert results[0] is None and results[3] is None
    assert (results[1].id, results[1].score, results[1].ok) == ("r/1", 0.5, True)
    assert (results[2].id, results[2].ok, results[2].error) == \
        ("r/2", False, "environment: timeout: episode r/2 timed out")
    assert to_score == [t.ScoreItem("r/0", "calc", "the prompt", "#### 42", "42", {"k": 1}, "stop"),
                        t.ScoreItem("r/3", "calc", "the prompt", "answer 3", "42", {"k": 1}, "stop")]


def test_a_received_completion_and_its_payload_ref_hold_every_field_and_stay_frozen():
    """Made without the frozen __init__ (issue 44): nothing may fall back to a class attribute."""
    import dataclasses

    completions = [_completion(i, payload=t.PayloadRef("10.0.0.1:7000", "r-9", i, 7)) for i in range(2)]
    group = convert.group_from_proto(convert.group_to_proto(
        t.GroupResult("r-9", completions, payload_address="10.0.0.1:7000")))
    for got, sent in zip(group.completions, completions):
        assert set(vars(got)) == {f.name for f in dataclasses.fields(t.Completion)}
        assert set(vars(got.payload)) == {f.name for f in dataclasses.fields(t.PayloadRef)}
        assert got == dataclasses.replace(sent, token_ids=got.token_ids, logprobs=got.logprobs)
        assert hash(got.payload) == hash(sent.payload)
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.payload.length = 1


def test_score_results_come_back_as_the_reward_service_sent_them():
    sent = t.ScoredBatch([t.ScoreResult("r/0", 1.0), t.ScoreResult("r/1", 0.0, ok=False, error="timeout"),
                          t.ScoreResult("r/2", 0.5, components={"format": 1.0, "answer": 0.0})],
                         {"format/calls": 3.0})
    got = convert.score_results_from_proto(convert.score_results_to_proto(sent))
    assert isinstance(got, t.ScoredBatch) and got.source_metrics == {"format/calls": 3.0}
    assert got == sent  # field by field, as the dataclass compares
    assert [r.components for r in got] == [{}, {}, {"format": 1.0, "answer": 0.0}]
    with pytest.raises(AttributeError):  # still frozen
        got[0].score = 2.0
