"""Packed (block-diagonal, restarting position ids) and padded micro-batches give the same
per-token log-probs, losses and gradients on a tiny random Qwen2, with and without chunked
log-probs; and the Learner options (packing, chunking, checkpointing) train identically."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlfleet.algorithm import AlgorithmConfig, LoraConfig
from rlfleet.config import LearnerConfig
from rlfleet.types import TrainBatch, TrainSample
from services.learner.batching import collate
from services.learner.forward import ForwardSettings, policy_logprobs
from services.learner.learner import Learner
from services.learner.packing import assign_rows, split_by_packed_budget

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")
V = 97


def tiny_qwen2(tied: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=V, max_position_embeddings=64,
                      tie_word_embeddings=tied,
                      attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).float().train()


def samples(lengths=((3, 5), (2, 2), (4, 7), (1, 3), (5, 1), (2, 4))) -> list[TrainSample]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i, (p, r) in enumerate(lengths):
        ids = torch.randint(1, V, (p + r,), generator=g).tolist()
        out.append(TrainSample(ids[:p], ids[p:], [-2.0] * r, advantage=float(i % 3) - 1.0,
                               generation_version=0))
    return out


ROUTES = [ForwardSettings(0, False), ForwardSettings(0, True), ForwardSettings(5, False),
          ForwardSettings(5, True)]


def _loss_and_grads(model, settings: ForwardSettings, temperature: float):
    mb = collate(samples(), pad_id=0, device=CPU, pack=settings.pack_sequences)
    model.zero_grad(set_to_none=True)
    lp, ent = policy_logprobs(model, mb, temperature, settings, entropy_grad=True)
    keep = mb.response_mask_B_T.bool()
    weights = mb.advantages_B[:, None].expand_as(lp)
    loss = torch.where(keep, -lp * weights - 0.01 * ent, 0.0).sum() / keep.sum()
    loss.backward()
    return lp[keep].detach(), ent[keep].detach(), loss.detach(), {n: p.grad.clone() for n, p in
                                                                  model.named_parameters()}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_all_routes_agree_with_padded_full_logits(tied: bool, temperature: float) -> None:
    model = tiny_qwen2(tied)
    mb = collate(samples(), pad_id=0, device=CPU, pack=True)
    assert mb.packed.input_ids_R_C.shape[0] < len(samples())  # several samples do share a row
    ref_lp, ref_ent, ref_loss, ref_grads = _loss_and_grads(model, ROUTES[0], temperature)
    for settings in ROUTES[1:]:
        lp, ent, loss, grads = _loss_and_grads(model, settings, temperature)
        torch.testing.assert_close(lp, ref_lp, atol=2e-5, rtol=1e-5, msg=str(settings))
        torch.testing.assert_close(ent, ref_ent, atol=2e-5, rtol=1e-5, msg=str(settings))
        torch.testing.assert_close(loss, ref_loss, atol=2e-6, rtol=1e-5, msg=str(settings))
        for name, g in ref_grads.items():
            torch.testing.assert_close(grads[name], g, atol=2e-5, rtol=1e-4, msg=f"{settings} {name}")


def test_packed_rows_and_budget() -> None:
    assert sorted(map(sorted, assign_rows([5, 3, 2, 4, 1]))) == [[0], [1, 2], [3, 4]]  # capacity 5
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples()]  # 8 4 11 4 6 6
    split = split_by_packed_budget(samples(), budget_tokens=16)
    assert [[len(s.prompt_ids) + len(s.response_ids) for s in mb]
            for mb in split] == [[8, 4], [11, 4], [6, 6]]
    assert sum(len(mb) for mb in split) == len(lengths)
    assert split_by_packed_budget(samples(), budget_tokens=1) == [[s] for s in samples()]


def test_packed_layout_maps_every_prediction() -> None:
    mb = collate(samples(), pad_id=0, device=CPU, pack=True)
    flat_targets = mb.packed.input_ids_R_C[:, 1:].reshape(-1)[mb.packed.index_B_T]
    valid = mb.attention_mask_B_L[:, 1:].bool()  # every real next token
    assert torch.equal(flat_targets[valid], mb.targets_B_T[valid])


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlfleet.models.tiny import build_tokenizer

    path = tmp_path_factory.mktemp("qwen2")
    model = tiny_qwen2(tied=True)
    model.config.vocab_size = V
    model.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


def _train(model_dir: Path, tmp_path: Path, **options) -> tuple[dict, dict]:
    cfg = LearnerConfig(lr=1e-2, micro_batch_tokens=24, **options)
    algo = AlgorithmConfig(kl_coef=0.05, entropy_coef=0.01, mini_batches=2)
    core = Learner(cfg, model_dir, CPU, torch.float32, tmp_path / "ckpt", seed=0, algorithm=algo,
                   max_response_tokens=8)
    result = core.train(TrainBatch(step=1, samples=samples(), expected_version=0))
    return result.metrics, {n: p.detach().clone() for n, p in core.model.named_parameters()}


def test_learner_options_train_like_the_plain_path(qwen2_dir: Path, tmp_path: Path) -> None:
    ref_metrics, ref_params = _train(qwen2_dir, tmp_path)
    for options in ({"pack_sequences": True}, {"logprob_chunk_tokens": 4},
                    {"pack_sequences": True, "logprob_chunk_tokens": 7, "gradient_checkpointing": True}):
        metrics, params = _train(qwen2_dir, tmp_path, **options)
        for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm",
                    "rollout/logprob_diff_mean"):
            assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-4, abs=1e-6), (options, key)
        for name, p in ref_params.items():
            torch.testing.assert_close(params[name], p, atol=1e-5, rtol=1e-4, msg=f"{options} {name}")


def test_lora_with_packing_and_chunking_trains_like_plain_lora(qwen2_dir: Path, tmp_path: Path) -> None:
    lora = LoraConfig(rank=4)
    ref_metrics, ref_params = _train(qwen2_dir, tmp_path, lora=lora)
    metrics, params = _train(qwen2_dir, tmp_path, lora=lora, pack_sequences=True, logprob_chunk_tokens=4)
    assert metrics["actor/kl_loss"] == pytest.approx(ref_metrics["actor/kl_loss"], rel=1e-4, abs=1e-7)
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, atol=1e-5, rtol=1e-4, msg=name)


def test_sharded_learner_rejects_single_process_options() -> None:
    with pytest.raises(ValueError, match="single-process"):
        LearnerConfig(world_size=2, pack_sequences=True)


def test_packing_is_refused_where_transformers_cannot_mask_packed_sequences(monkeypatch):
    from transformers import masking_utils

    from rlfleet.config import LearnerConfig
    from services.learner.forward import ForwardSettings

    assert ForwardSettings.of(LearnerConfig(pack_sequences=True), torch.device("cpu")).pack_sequences
    monkeypatch.delattr(masking_utils, "find_packed_sequence_indices")
    with pytest.raises(ValueError, match="learner.pack_sequences"):
        ForwardSettings.of(LearnerConfig(pack_sequences=True), torch.device("cpu"))
    # packing off: no requirement
    assert not ForwardSettings.of(LearnerConfig(), torch.device("cpu")).pack_sequences


def test_packing_and_chunked_logprobs_default_on_for_a_single_gpu_learner_only():
    """learner.pack_sequences / logprob_chunk_tokens left null: on where they won (one process on a
    GPU), off elsewhere; an explicit setting always wins."""
    assert LearnerConfig().forward_layout(on_gpu=True) == (8192, True)
    assert LearnerConfig().forward_layout(on_gpu=False) == (0, False)
    assert LearnerConfig(world_size=2).forward_layout(on_gpu=True) == (0, False)
    off = LearnerConfig(pack_sequences=False, logprob_chunk_tokens=0)
    assert off.forward_layout(on_gpu=True) == (0, False)
    on = LearnerConfig(pack_sequences=True, logprob_chunk_tokens=512)
    assert on.forward_layout(on_gpu=False) == (512, True)
    assert ForwardSettings.of(LearnerConfig(), torch.device("cpu")) == ForwardSettings(0, False)
