"""Learner checkpoints restore everything a resumed run needs; controller state and journal."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import structlog.testing
import torch

from controller.journal import Journal, audit
from controller.state import (
    ControllerState,
    Dispatch,
    load_state,
    resolve_resume,
    restore_source,
    save_state,
    source_state,
    truncate_jsonl,
)
from rlfleet.algorithm import AlgorithmConfig, LoraConfig
from rlfleet.config import LearnerConfig
from rlfleet.data.prompts import Prompt, PromptSource
from rlfleet.errors import CheckpointError
from rlfleet.types import TrainBatch, TrainSample
from rlfleet.app.launch import local_learner_checkpoints
from services.learner.checkpoint import (latest_checkpoint, resolve_checkpoint, restore_learner,
                                         resumable_checkpoints)
from services.learner.learner import Learner

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")


def batch(step: int, version: int) -> TrainBatch:
    rows = [([3, 4, 5], [6, 7, 8], 1.0, 1.0), ([3, 4, 5], [9, 10], 0.0, -1.0),
            ([11, 12], [13, 14, 15, 16], 0.5, 1.0), ([11, 12], [17], 0.0, -1.0)]
    samples = [TrainSample(prompt_ids=p, response_ids=r, behaviour_logprobs=[-3.0] * len(r), advantage=a,
                           generation_version=version, reward=rew) for p, r, rew, a in rows]
    return TrainBatch(step=step, samples=samples, expected_version=version)


def make(model_dir: Path, ckpt: Path, **kw) -> Learner:
    lora = kw.pop("lora", None)
    cfg = LearnerConfig(lr=1e-2, lora=lora or LoraConfig())
    return Learner(cfg, model_dir, CPU, torch.float32, ckpt, seed=0, algorithm=AlgorithmConfig(**kw),
                   max_response_tokens=4)


@pytest.mark.parametrize("setup", [{}, {"name": "ppo"}, {"lora": LoraConfig(rank=4)}],
                         ids=["full", "ppo-critic", "lora"])
def test_restored_learner_continues_exactly(tiny_model_dir: Path, tmp_path: Path, setup) -> None:
    """Two steps, checkpoint, two more; a fresh learner restored from the checkpoint does the same
    two more steps bit for bit (weights, Adam moments and step count, critic, RNG)."""
    ckpt = tmp_path / "ckpt"
    a = make(tiny_model_dir, ckpt, **dict(setup))
    for step in (1, 2):
        a.train(batch(step, step - 1))
    path = a.save_checkpoint(2)
    expected = [a.train(batch(step, step - 1)).metrics for step in (3, 4)]

    torch.manual_seed(1234)  # another RNG state: the checkpoint's must be restored (mini-batch shuffles)
    random.seed(99)
    b = make(tiny_model_dir, ckpt, **dict(setup))
    torch.rand(3)
    assert b.version == 0
    meta = restore_learner(b, path)
    assert (meta["step"], b.version, b.step) == (2, 2, 2)
    got = [b.train(batch(step, step - 1)).metrics for step in (3, 4)]
    for e, g in zip(expected, got):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert e[key] == g[key], key
    for (name, wa), (_, wb) in zip(a.named_weights(), b.named_weights()):
        assert torch.equal(wa, wb), name
    if setup.get("name") == "ppo":
        assert e["critic/vf_loss"] == g["critic/vf_loss"]


def test_half_written_checkpoints_are_never_picked_and_corrupt_ones_are_named(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    core = make(tiny_model_dir, ckpt)
    good = core.save_checkpoint(1)
    # A crash while writing step 2 leaves a temp folder, and one without meta.json.
    shutil.copytree(good, ckpt / "step_2.tmp-999")
    (ckpt / "step_3").mkdir()
    assert latest_checkpoint(ckpt) == good
    assert resolve_checkpoint(ckpt, "latest") == good and resolve_checkpoint(ckpt, "auto") == good
    assert resolve_checkpoint(tmp_path / "none", "auto") is None
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path / "none", "latest")
    with pytest.raises(CheckpointError, match="incomplete"):
        resolve_checkpoint(ckpt, str(ckpt / "step_3"))
    # A truncated file is a clear error naming it.
    with open(good / "optimizer.pt", "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(CheckpointError, match="optimizer.pt has 100 bytes"):
        restore_learner(make(tiny_model_dir, ckpt), good)
    (good / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="meta.json"):
        restore_learner(make(tiny_model_dir, ckpt), good)


def prompts(n: int) -> list[Prompt]:
    return [Prompt(index=i, text=f"p{i}", prompt_ids=[i + 1], data_source="t", ground_truth="")
            for i in range(n)]


def test_prompt_source_state_round_trips(tmp_path: Path) -> None:
    a = PromptSource(prompts(5), seed=3)
    for _ in range(7):  # into the second epoch
        a.next()
    b = PromptSource(prompts(5), seed=3)
    restore_source(b, json.loads(json.dumps(source_state(a))))
    assert [a.next().index for _ in range(9)] == [b.next().index for _ in range(9)]
    with pytest.raises(CheckpointError, match="same data files"):
        restore_source(PromptSource(prompts(4)), source_state(a))


def test_controller_state_resolution_and_truncation(tmp_path: Path) -> None:
    run = tmp_path / "run"
    state = ControllerState(4, 4, 21, source_state(PromptSource(prompts(5))),
                            [{"seed": 7, "members": [[19, 2], [20, 3]]}])
    save_state(run, state)
    with pytest.raises(CheckpointError, match="nothing to resume"):
        resolve_resume(run, "latest", {})  # the learner has no checkpoint of that step
    ckpt = str(run / "checkpoints" / "step_4")
    learner_has = {2: str(run / "checkpoints" / "step_2"), 4: ckpt}  # as the learner reports them
    save_state(run, ControllerState(6, 6, 30, state.source, []))  # its learner checkpoint never completed
    state_file, found = resolve_resume(run, "latest", learner_has)
    assert found == ckpt
    assert resolve_resume(run, ckpt, learner_has) == (state_file, ckpt)
    with pytest.raises(CheckpointError, match="no complete checkpoint of step 6"):
        resolve_resume(run, str(run / "checkpoints" / "step_6"), learner_has)
    loaded = load_state(state_file)
    assert loaded == state
    [d] = loaded.dispatches(prompts(5))
    assert d.seed == 7 and [(s, p.index) for s, p in d.members] == [(19, 2), (20, 3)]
    state_file.write_text("{")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_state(state_file)
    metrics = run / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 7)) + '{"step": 7, "cut')
    assert truncate_jsonl(metrics, 4) == 3
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [1, 2, 3, 4]


def test_journal_audit_finds_lost_and_twice_trained_prompts(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    for seq in range(4):
        j.record("dispatched", seq=seq)
    j.record("trained", seq=0, step=1)
    j.record("dropped", seq=1, reason="stale")
    j.record("requeued", seq=2, reason="rollout_failed")
    j.record("trained", seq=3, step=2)
    j.record("resumed", step=1)  # step 2 rolled back with the model: seq 3 must be trained again
    j.record("dispatched", seq=2)
    j.record("trained", seq=2, step=2)
    j.close()
    result = audit(j.path)
    assert result.lost == [3] and result.trained_twice == [] and result.dropped == {1: "stale"}
    j = Journal(tmp_path)
    j.record("dispatched", seq=3)
    j.record("trained", seq=3, step=3)
    j.record("trained", seq=0, step=3)
    j.close()
    result = audit(j.path)
    assert result.lost == [] and result.trained_twice == [0]
    assert Dispatch(1, [(5, prompts(1)[0])]).request_ids() == {"p0-s5": (5, prompts(1)[0])}


def test_lr_schedule_reaches_the_optimizer_and_survives_resume(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Warmup 2 then linear decay over a 6-step job: lr 1e-2 * [1/3, 2/3, 1, 3/4, 1/2, 1/4]; a learner
    restored after step 3 continues at 3/4 rather than starting the schedule again."""
    ckpt = tmp_path / "ckpt"
    cfg = LearnerConfig(lr=1e-2, lr_scheduler="linear", lr_warmup_steps=2)

    def fresh() -> Learner:
        return Learner(cfg, tiny_model_dir, CPU, torch.float32, ckpt, seed=0, max_response_tokens=4,
                       total_steps=6)

    a = fresh()
    seen = [a.train(batch(step, step - 1)).metrics["actor/lr"] for step in (1, 2, 3)]
    path = a.save_checkpoint(3)
    b = fresh()
    restore_learner(b, path)
    seen += [b.train(batch(step, step - 1)).metrics["actor/lr"] for step in (4, 5, 6)]
    assert seen == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 7.5e-3, 5e-3, 2.5e-3])


def flip_bytes(path: Path, offset: int, count: int = 4096) -> None:
    """Damages `count` bytes in place: the size stays what meta.json recorded."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        data = fh.read(count)
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in data))


def test_a_checkpoint_damaged_in_place_is_refused_and_latest_falls_back(tiny_model_dir: Path,
                                                                        tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    core = make(tiny_model_dir, ckpt)
    core.train(batch(1, 0))
    good = core.save_checkpoint(1)
    core.train(batch(2, 1))
    newest = core.save_checkpoint(2)
    weights = newest / "model.safetensors"
    size = weights.stat().st_size
    flip_bytes(weights, size // 2)  # inside the tensor data: safetensors itself still loads it
    assert weights.stat().st_size == size
    with pytest.raises(CheckpointError, match=r"content of model.safetensors changed"):
        restore_learner(make(tiny_model_dir, ckpt), newest)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        resolve_checkpoint(ckpt, str(newest))  # named explicitly: refused, no silent substitute
    with structlog.testing.capture_logs() as logs:
        assert resolve_checkpoint(ckpt, "latest") == good and resolve_checkpoint(ckpt, "auto") == good
    assert any("step_2" in e["event"] and "model.safetensors" in e["event"] for e in logs), logs
    restored = make(tiny_model_dir, ckpt)
    assert restore_learner(restored, good, verified=True)["step"] == 1 and restored.version == 1
    flip_bytes(good / "optimizer.pt", 0, 16)  # every checkpoint damaged: an error, not a fresh start
    with pytest.raises(CheckpointError, match="no usable checkpoint.*step_2.*step_1"):
        resolve_checkpoint(ckpt, "auto")


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_good_one(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    run = tmp_path / "run"
    core = make(tiny_model_dir, run / "checkpoints")
    source = source_state(PromptSource(prompts(5)))
    for step in (1, 2):
        core.train(batch(step, step - 1))
        core.save_checkpoint(step)
        save_state(run, ControllerState(step, step, 4 * step, source, []))
    with open(run / "checkpoints" / "step_2" / "optimizer.pt", "r+b") as fh:
        fh.truncate(100)
    with structlog.testing.capture_logs() as logs:
        # controller.resume=latest under `rlfleet run`: the newest GOOD step, read before the learner starts
        state_file, ckpt = resolve_resume(run, "latest", local_learner_checkpoints(run, "latest"))
    assert (state_file, ckpt) == (run / "controller_state" / "step_1.json",
                                  str(run / "checkpoints" / "step_1"))
    assert any("step_2" in e["event"] and "optimizer.pt has 100 bytes" in e["event"] for e in logs), logs
    assert resolve_checkpoint(run / "checkpoints",
                              "latest") == Path(ckpt)  # the learner's own `latest` agrees
    # what the learner reports to a resuming controller (ListCheckpoints): the damaged step left out
    assert resumable_checkpoints(run / "checkpoints") == {1: Path(ckpt)}
    with pytest.raises(CheckpointError, match="optimizer.pt has 100 bytes"):  # named: the learner refuses it
        resolve_checkpoint(run / "checkpoints", str(run / "checkpoints" / "step_2"))
    (run / "controller_state" / "step_1.json").write_text("{")  # now no step is whole
    with pytest.raises(CheckpointError, match="nothing to resume.*step_1.json is unreadable"):
        resolve_resume(run, "latest", local_learner_checkpoints(run, "latest"))
