"""bench/parity_table.py on hand-made results: the rlfleet runs' own evaluations, the TRL checkpoints'
`rlfleet eval` reports, the base model as TRL's step 0, mean ± sd over seeds, merging two phases' tables,
train reward windows, and one-line errors for bad input."""
import json
import tarfile

import pytest

from bench.parity_table import main, merge, read_input, summarize

pytestmark = pytest.mark.unit


def write_metrics(path, vals, rewards=()):
    lines = [{"step": s, "val/accuracy": a, "val/rlfleet/arithmetic/accuracy": a} for s, a in vals]
    lines += [{"step": s, "reward/mean": r, "actor/pg_loss": 0.0, "timing/step_s": 2.0 + s % 2}
              for s, r in rewards]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def write_eval(path, accuracy, prompts=500):
    path.write_text(json.dumps({"overall": {"accuracy": accuracy, "prompts": prompts},
                                "by_source": {"rlfleet/arithmetic": {"rule": "arithmetic (after ####)"}}}))


@pytest.fixture
def parity_dir(tmp_path):
    d = tmp_path / "parity"
    d.mkdir()
    write_metrics(d / "metrics-rlfleet-S0-seed1.jsonl", [(0, 0.06), (20, 0.08), (40, 0.10)],
                  rewards=[(1, 0.1), (2, 0.3), (21, 0.5)])
    write_metrics(d / "metrics-rlfleet-S0-seed2.jsonl", [(0, 0.06), (20, 0.10), (40, 0.14)])
    write_eval(d / "eval-base.json", 0.066)
    write_eval(d / "eval-trl-seed1-step20.json", 0.09)
    write_eval(d / "eval-trl-seed2-step20.json", 0.11)
    write_eval(d / "eval-trl-seed1-step40.json", 0.12)
    (d / "trl_steps-trl-seed1.jsonl").write_text('{"step": 1, "t": 10, "reward": 0.2}\n'
                                                 '{"step": 20, "t": 16, "reward": 0.4}\n'
                                                 '{"step": 21, "t": 23, "reward": 1.0}\n'
                                                 '{"step": 40, "t": 31, "reward": 0.0}\n')
    (d / "unrelated.log").write_text("not read")
    return d


def test_mean_sd_and_per_seed(parity_dir):
    records, base = merge([read_input(parity_dir)])
    summary = summarize(records)
    assert list(summary) == ["trl", "rlfleet-S0"]  # TRL first
    s20 = summary["rlfleet-S0"][20]
    assert s20["mean"] == pytest.approx(0.09) and s20["sd"] == pytest.approx(0.0141421, rel=1e-4)
    assert s20["n"] == 2 and s20["seeds"] == {1: 0.08, 2: 0.10}
    # TRL's step 0 is the base model's evaluation, for each seed it has
    assert summary["trl"][0] == {"mean": 0.066, "sd": pytest.approx(0.0), "n": 2,
                                 "seeds": {1: 0.066, 2: 0.066}}
    assert summary["trl"][40]["sd"] is None and summary["trl"][40]["n"] == 1
    # the rlfleet runs keep their own step 0
    assert summary["rlfleet-S0"][0]["seeds"] == {1: 0.06, 2: 0.06}
    by_key = {(r["arm"], r["seed"], r["step"]): r for r in records}
    assert by_key[("rlfleet-S0", 1, 20)]["train_reward"] == pytest.approx(0.2)  # steps 1-20
    assert by_key[("rlfleet-S0", 1, 40)]["train_reward"] == pytest.approx(0.5)  # step 21
    assert by_key[("trl", 1, 20)]["train_reward"] == pytest.approx(0.3)
    assert by_key[("trl", 1, 20)]["rule"] == "arithmetic (after ####)"
    # median seconds per step: rlfleet's timing/step_s (3, 2, 3), TRL's differences of t (6, 7, 8)
    assert by_key[("rlfleet-S0", 1, 0)]["s_per_step"] == 3.0 and by_key[("trl", 1, 40)]["s_per_step"] == 7.0
    assert "s_per_step" not in by_key[("rlfleet-S0", 2, 20)]  # no training lines in its metrics


def test_cli_writes_json_and_markdown_and_merges_a_later_phase(parity_dir, tmp_path, capsys):
    assert main([str(parity_dir), "--out", str(tmp_path / "t" / "parity")]) == 0
    md = (tmp_path / "t" / "parity.md").read_text()
    assert "| trl | 6.6 ± 0.0 (n=2) | 10.0 ± 1.4 (n=2) | 12.0 (n=1) |" in md
    assert "| rlfleet-S0 | 1 | 6.0 | 8.0 [0.200] | 10.0 [0.500] | 3.00 |" in md
    assert "| rlfleet-S0 | 2 | 6.0 | 10.0 | 14.0 | – |" in md
    assert "arithmetic (after ####)" in md and md == capsys.readouterr().out
    # the staleness phase comes back in another folder, packed; merged with the parity table
    stale = tmp_path / "stale"
    stale.mkdir()
    write_metrics(stale / "metrics-rlfleet-S1-seed1.jsonl", [(0, 0.06), (20, 0.07)])
    write_metrics(stale / "metrics-rlfleet-S0-seed2.jsonl", [(0, 0.06), (20, 0.12)])  # a rerun: replaces
    with tarfile.open(tmp_path / "staleness-raw.tgz", "w:gz") as tar:
        tar.add(stale, arcname="staleness-raw")
    assert main([str(tmp_path / "t" / "parity.json"), str(tmp_path / "staleness-raw.tgz"),
                 "--out", str(tmp_path / "all")]) == 0
    table = json.loads((tmp_path / "all.json").read_text())
    assert list(table["summary"]) == ["trl", "rlfleet-S0", "rlfleet-S1"]
    assert table["summary"]["rlfleet-S0"]["20"]["seeds"] == {"1": 0.08, "2": 0.12}
    assert table["summary"]["rlfleet-S1"]["20"]["mean"] == 0.07


def test_a_cut_last_line_is_skipped_but_bad_input_is_one_line(tmp_path, capsys):
    d = tmp_path / "r"
    d.mkdir()
    (d / "metrics-rlfleet-S2-seed3.jsonl").write_text('{"step": 0, "val/accuracy": 0.05}\n{"step": 20, "val/')
    records, _ = merge([read_input(d)])
    assert [(r["arm"], r["seed"], r["step"]) for r in records] == [("rlfleet-S2", 3, 0)]
    (d / "eval-trl-seed1-step20.json").write_text('{"overall": {}}')
    assert main([str(d), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "eval-trl-seed1-step20.json: not an `rlfleet eval` report" in err and "Traceback" not in err
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty), "--out", str(tmp_path / "x")]) == 1
