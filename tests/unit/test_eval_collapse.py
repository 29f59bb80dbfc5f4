"""Collapse made visible: the majority-answer baseline, answer diversity, clipped share and the
per-token NLL of an evaluation, in its summary, table, metrics and report. Numbers derived by hand."""

from __future__ import annotations

import json

import pytest

from rlfleet.eval.answers import answer_of, majority, truth_of
from rlfleet.eval.report import format_table, write_report
from rlfleet.eval.runner import run_eval
from rlfleet.eval.scoring import EvalSample, flat_metrics, summarize

pytestmark = pytest.mark.unit


def sample(prompt, i, response, truth, source="a", reward=0.0, finish="stop", nll=None, length=4):
    return EvalSample(prompt_index=prompt, data_source=source, sample=i, prompt="p", response=response,
                      ground_truth=truth, length=length, finish_reason=finish, policy_version=0,
                      reward=reward, nll=nll)


def test_answer_of_reads_tags_boxed_hashes_numbers_then_text():
    assert answer_of("<think>2+2</think><answer> 4 </answer>") == "4"
    assert answer_of("<answer>1</answer> then <answer>2</answer>") == "2"  # the last tag
    assert answer_of("so \\boxed{17} and 3") == "17"
    assert answer_of("12 apples\n#### 1,234.") == "1234"  # after ####: commas and full stop dropped
    assert answer_of("#### 72 apples") == "72"  # after ####: its leading number when it has one
    assert answer_of("#### about seven") == "about seven"
    assert answer_of("3 then 5 then 8 apples") == "8"  # no marker: the last number
    assert answer_of("  Paris \n is   it ") == "Paris is it"  # no number: the text, spaces collapsed
    assert answer_of("x" * 100) == "x" * 40  # cut to MAX_ANSWER_CHARS
    assert answer_of("") == ""
    assert truth_of("Natalia sold 48 + 24 = 72 clips.\n#### 72") == "72"
    assert truth_of(" 1 ") == "1"


def test_majority_by_hand():
    m = majority(["1", "1", "2", "3"])
    assert (m.value, m.count, m.total, m.distinct) == ("1", 2, 4, 3) and m.share == 0.5
    assert majority(["b", "a", "a", "b"]).value == "b"  # a tie goes to the value seen first
    assert majority([]) is None


def test_baseline_and_diversity_by_hand():
    # source a: 4 prompts, ground truths [1, 1, 2, 3] -> always answering "1" is right on 2 of 4: 50 %.
    # Answers [1, 1, 1, 2] -> 2 distinct, the most common ("1") 3 of 4: 75 %.
    a = [sample(0, 0, "<answer>1</answer>", "1", reward=1.0), sample(1, 0, "1", "1", reward=1.0),
         sample(2, 0, "it is 1", "2"), sample(3, 0, "#### 2", "3")]
    # source b: 2 prompts x 2 samples, truths [7, 8] -> 1 of 2: 50 %; answers [7, 9, 9, 9]: 2, 75 %.
    b = [sample(4, 0, "7", "7", "b", 1.0), sample(4, 1, "9", "7", "b"),
         sample(5, 0, "9", "8", "b"), sample(5, 1, "9", "8", "b")]
    s = summarize([*a, *b], n=1)
    sa, sb, overall = s["by_source"]["a"], s["by_source"]["b"], s["overall"]
    assert (sa["majority_answer"], sa["majority_baseline"]) == ("1", 0.5)
    assert (sa["answers_distinct"], sa["top_answer"], sa["top_answer_share"]) == (2, "1", 0.75)
    assert (sb["majority_answer"], sb["majority_baseline"]) == ("7", 0.5)
    assert (sb["answers_distinct"], sb["top_answer"], sb["top_answer_share"]) == (2, "9", 0.75)
    # over all sources: each source's own majority, prompts weighted: (0.5 * 4 + 0.5 * 2) / 6 = 0.5
    # (one pooled majority would give "1": 2 of 6)
    assert overall["majority_baseline"] == pytest.approx(0.5) and overall["majority_answer"] is None
    # all answers pooled: 1,1,1,2,7,9,9,9 -> 4 distinct; "1" and "9" 3 each, "1" seen first: 3/8
    assert (overall["answers_distinct"], overall["top_answer"]) == (4, "1")
    assert overall["top_answer_share"] == pytest.approx(3 / 8)
    m = flat_metrics(s)
    assert m["val/a/majority_baseline"] == 0.5 and m["val/a/answers/top_share"] == 0.75
    assert m["val/a/answers/distinct"] == 2.0 and m["val/majority_baseline"] == pytest.approx(0.5)


def test_clipped_share_length_and_nll_by_hand():
    # 4 samples: 1 hit max_new_tokens -> clipped 0.25; lengths 4, 4, 8, 16 -> mean 8.0;
    # NLL known for 2 of them, 0.5 and 1.5 nats a token -> 1.0
    samples = [sample(0, 0, "1", "1", finish="length", nll=0.5), sample(1, 0, "2", "2", nll=1.5),
               sample(2, 0, "3", "3", length=8), sample(3, 0, "4", "4", length=16)]
    s = summarize(samples, n=1)["by_source"]["a"]
    assert s["clipped"] == 0.25 and s["response_length_mean"] == 8.0 and s["nll_mean"] == 1.0
    m = flat_metrics(summarize(samples, n=1))
    assert m["val/a/response_length/clip_ratio"] == 0.25 and m["val/nll/mean"] == 1.0
    # no log-probs at all: no NLL anywhere
    plain = summarize([sample(0, 0, "1", "1")], n=1)
    assert plain["overall"]["nll_mean"] is None and "val/nll/mean" not in flat_metrics(plain)
    assert "nll" not in format_table(plain).splitlines()[0].split()


def test_table_and_report_show_the_collapse(tmp_path):
    # 5 prompts of letter_counting, truths [1, 1, 2, 3, 4] (baseline 2/5 = 40 %), answers
    # [1, 1, 1, 1, 2] (2 distinct, "1" 4/5 = 80 %); 2 correct -> accuracy 40 %, not above the baseline
    truths, answers = ["1", "1", "2", "3", "4"], ["1", "1", "1", "1", "2"]
    samples = [sample(i, 0, f"<answer>{a}</answer>", t, "letter_counting", float(a == t), finish="length"
                      if i == 4 else "stop") for i, (a, t) in enumerate(zip(answers, truths))]
    s = summarize(samples, n=1)
    header, row, _all, *notes = format_table(s).splitlines()
    assert header.split() == ["data_source", "prompts", "samples", "accuracy", "baseline", "pass@1",
                              "reward", "length", "clipped", "failed", "distinct", "top"]
    assert row.split() == ["letter_counting", "5", "5", "0.4000", "0.4000", "0.4000", "0.4000", "4.0",
                           "0.20", "0", "2", "0.80"]
    assert notes == [
        "note: letter_counting: 80% of answers are '1' (the most frequent ground truth)",
        "note: letter_counting: accuracy 40% is not above the majority-answer baseline 40% "
        "(always answering '1')",
    ]
    report, _ = write_report(tmp_path / "r.json", s, samples, {})
    data = json.loads(report.read_text())["by_source"]["letter_counting"]
    assert (data["majority_baseline"], data["answers_distinct"], data["top_answer_share"]) == (0.4, 2, 0.8)
    assert (data["top_answer"], data["majority_answer"], data["clipped"]) == ("1", "1", 0.2)
    # a policy with diverse answers above its baseline gets no note
    fine = summarize([sample(i, 0, t, t, reward=1.0) for i, t in enumerate(truths)], n=1)
    assert len(format_table(fine).splitlines()) == 3


def test_run_eval_reads_the_answer_of_the_final_turn_and_the_nll():
    from rlfleet.data.prompts import Prompt
    from rlfleet.types import Completion, GroupResult, ScoreResult, TurnRecord

    prompt = Prompt(index=0, data_source="calc", text="q", prompt_ids=[1], ground_truth="5")
    # an episode: turn 1 calls a tool, turn 2 answers; 3 model tokens (log-probs -0.5, -1.0, -1.5) and
    # 2 observation tokens (log-prob 0, masked) -> NLL (0.5 + 1.0 + 1.5) / 3 = 1.0
    episode = Completion(token_ids=[5, 6, 7, 8, 9], logprobs=[-0.5, 0.0, 0.0, -1.0, -1.5],
                         finish_reason="stop", policy_version=0, text="call 2+3 -> 5 so 5",
                         loss_mask=[1, 0, 0, 1, 1],
                         turns=(TurnRecord(1, 2, 0, 0, tool_calls=1, text="<tool>2+3</tool> 9"),
                                TurnRecord(2, 0, 0, 0, text="<answer>5</answer>")))

    def generate(requests, params):
        yield GroupResult(requests[0].request_id, [episode])

    def score(items):
        return [ScoreResult(item.id, 1.0) for item in items]

    from rlfleet.types import SamplingParams

    [s] = run_eval([prompt], generate, score, SamplingParams(n=1, temperature=0.0, max_new_tokens=8))
    assert s.answer == "5" and s.nll == pytest.approx(1.0) and (s.turns, s.tool_calls) == (2, 1)


def test_plot_panels_draw_accuracy_against_its_baseline_and_the_episode_curves(tmp_path):
    from rlfleet.app.plot import panels, plot_run

    lines = [
        {"step": 1, "reward/mean": 0.2, "reward/std": 0.1, "actor/entropy": 2.0, "response_length/mean": 9,
         "response_length/clip_ratio": 0.5, "env/episodes": 8, "env/turns_mean": 2.0,
         "env/tool_calls_per_episode": 1.5, "env/tool_errors": 2},
        {"step": 2, "reward/mean": 0.4, "val/accuracy": 0.3, "val/majority_baseline": 0.34,
         "val/lc/accuracy": 0.3, "val/lc/majority_baseline": 0.34, "val/lc/answers/top_share": 0.76,
         "val/nll/mean": 0.1, "env/episodes": 8, "env/tool_errors": 0},
    ]
    drawn = {p.title: {c.label: (c.xs, c.ys, c.style) for c in p.curves} for p in panels(lines)}
    assert len(drawn) == 9
    reward = drawn["reward / validation accuracy vs majority-answer baseline"]
    assert list(reward) == ["train reward", "val/accuracy", "val baseline", "val/lc/accuracy",
                            "val/lc baseline"]
    assert reward["val/lc baseline"] == ([2.0], [0.34], ":")
    assert drawn["entropy (nats/token)"]["train entropy"] == ([1.0], [2.0], "-")
    assert drawn["entropy (nats/token)"]["validation NLL of own tokens"][:2] == ([2.0], [0.1])
    collapse = drawn["answer collapse and clipping (share)"]
    assert [p.ylim for p in panels(lines) if p.title.startswith("answer collapse")] == [(-0.02, 1.02)]
    assert collapse["val/lc most common answer"][:2] == ([2.0], [0.76])
    assert collapse["train clipped"][:2] == ([1.0], [0.5])
    episodes = drawn["multi-turn: per episode"]
    assert episodes["tool errors"][:2] == ([1.0, 2.0], [0.25, 0.0])  # 2 errors / 8 episodes, then 0 / 8
    assert episodes["turns"][:2] == ([1.0], [2.0]) and episodes["tool calls"][:2] == ([1.0], [1.5])
    # a single-turn run without validation: those panels are empty ("not logged" on the figure)
    plain = {p.title: p.curves for p in panels([{"step": 1, "reward/mean": 0.5}])}
    assert plain["multi-turn: per episode"] == [] and plain["answer collapse and clipping (share)"] == []
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    assert plot_run(tmp_path).stat().st_size > 0
