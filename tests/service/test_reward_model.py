"""The reward model core and the reward service serving it, on a tiny random
Qwen2ForSequenceClassification (num_labels=1) built here with the session's tokenizer."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.config import load_config
from rlfleet.errors import ConfigError
from rlfleet.proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet.rpc.channel import open_channel
from rlfleet.rpc.server import ServiceServer
from rlfleet.types import ScoreItem
from services.reward.build import build_scorer
from services.reward.rm import RewardModel
from services.reward.servicer import SERVICE_NAME, RewardServicer

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

CPU = torch.device("cpu")


def build_rm(path: Path, tokenizer, num_labels: int = 1) -> Path:
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=64,
                         max_position_embeddings=128,
                         num_labels=num_labels, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return build_rm(tmp_path_factory.mktemp("rm"), tiny_tokenizer)


def item(i: int, prompt: str, response: str) -> ScoreItem:
    return ScoreItem(id=f"i{i}", data_source="any", prompt=prompt, response=response, ground_truth="")


ITEMS = [item(0, "12+3=", "15"), item(1, "what is 7*6? ", "42"), item(2, "a", "b"),
         item(3, "reverse 1234: ", "4321 done"), item(4, "x", "yy zz")]


def test_batched_scores_equal_one_by_one(rm_dir):
    model = RewardModel(rm_dir, CPU, torch.float32, batch_size=3)  # two batches, padded differently
    batched = model.score(ITEMS)
    assert [r.id for r in batched] == [i.id for i in ITEMS] and all(r.ok for r in batched)
    alone = [model.score([i])[0].score for i in ITEMS]
    assert [r.score for r in batched] == pytest.approx(alone, abs=1e-5)
    assert len({round(r.score, 6) for r in batched}) > 1  # the scores do depend on the text


def test_scores_are_the_models_value_at_the_last_token(rm_dir, tiny_tokenizer):
    from transformers import AutoModelForSequenceClassification

    model = RewardModel(rm_dir, CPU, torch.float32)
    hf = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    ids = tiny_tokenizer(ITEMS[1].prompt + ITEMS[1].response, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        expected = hf(**ids).logits[0, 0].item()
    assert model.score([ITEMS[1]])[0].score == pytest.approx(expected, abs=1e-5)


def test_long_inputs_keep_the_response(rm_dir):
    model = RewardModel(rm_dir, CPU, torch.float32, max_length=8)
    short = model.score([item(0, "0", "1234")])[0].score
    long_prompt = model.score([item(0, "9" * 50 + "0", "1234")])[0].score
    # Only the last 8 tokens are kept: "0" + "1234" are among them in both cases, so the
    # response is never cut; the long prompt's tail "99990" differs from "0", so scores differ.
    assert model.tokenizer.truncation_side == "left"
    enc = model.tokenizer("9" * 50 + "0" + "1234", truncation=True, max_length=8, add_special_tokens=False)
    assert model.tokenizer.decode(enc["input_ids"]).endswith("01234")
    assert short != long_prompt


def test_multi_label_model_is_refused(tmp_path, tiny_tokenizer):
    path = build_rm(tmp_path / "two", tiny_tokenizer, num_labels=2)
    with pytest.raises(ConfigError, match="num_labels=1"):
        RewardModel(path, CPU, torch.float32)
    with pytest.raises(ConfigError, match="not a model folder"):
        RewardModel(tmp_path / "missing", CPU, torch.float32)


def test_reward_service_serves_the_model_from_config(rm_dir):
    cfg = load_config(None, [f"reward.model.path={rm_dir}", "reward.model.device=cpu",
                             "reward.model.batch_size=2"])
    core = build_scorer(cfg.reward)
    assert isinstance(core, RewardModel) and core.batch_size == 2 and core.device == CPU
    servicer = RewardServicer()
    server = ServiceServer([SERVICE_NAME], "127.0.0.1", 0, max_workers=2)
    server.add(reward_pb2_grpc.add_RewardServicer_to_server, servicer)
    server.start()
    servicer.attach(core)
    server.mark_serving()
    channel = open_channel(server.address)
    try:
        request = reward_pb2.ScoreRequest(items=[
            reward_pb2.ScoreItem(id=i.id, data_source=i.data_source, prompt=i.prompt, response=i.response)
            for i in ITEMS])
        reply = reward_pb2_grpc.RewardStub(channel).Score(request, timeout=30)
        direct = core.score(ITEMS)
        assert [r.id for r in reply.results] == [i.id for i in ITEMS]
        assert [r.score for r in reply.results] == pytest.approx([r.score for r in direct], abs=1e-5)
    finally:
        channel.close()
        server.stop(grace_s=0)
