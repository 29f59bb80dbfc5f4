"""What a joining replica must share with the run (rlfleet.models.identity), and the address it gives."""
from __future__ import annotations

import json
import shutil
import socket

import pytest

from rlfleet.app.fleet_member import advertised_address
from rlfleet.models.identity import architecture, difference, identity_of, model_identity
from rlfleet.models.resolve import resolve_model_path
from rlfleet.rpc.service_main import announce, reannounce

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tiny():
    return resolve_model_path("builtin:tiny")


def _copy(tiny, tmp_path, name: str = "copy"):
    folder = tmp_path / name
    shutil.copytree(tiny, folder)
    return folder


def test_other_weights_same_architecture_and_tokenizer_is_the_same_model(tiny, tmp_path):
    copy = _copy(tiny, tmp_path)
    (copy / "model.safetensors").write_bytes(b"other weights: the joiner receives the run's anyway")
    config = json.loads((copy / "config.json").read_text())
    config["transformers_version"] = "0.0.1"  # saved by another version: the same network
    (copy / "config.json").write_text(json.dumps(config, indent=4))
    assert model_identity(copy) == model_identity(tiny)


def test_an_architecture_key_or_the_tokenizer_makes_another_model(tiny, tmp_path):
    wider = _copy(tiny, tmp_path, "wider")
    config = json.loads((wider / "config.json").read_text())
    config["intermediate_size"] = 2 * config["intermediate_size"]
    (wider / "config.json").write_text(json.dumps(config))
    retokenized = _copy(tiny, tmp_path, "retokenized")
    tokenizer = json.loads((retokenized / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["<extra>"] = len(tokenizer["model"]["vocab"])  # one more token
    (retokenized / "tokenizer.json").write_text(json.dumps(tokenizer))
    ours = architecture(tiny)
    assert identity_of(architecture(wider)) != identity_of(ours)
    assert identity_of(architecture(retokenized)) != identity_of(ours)
    size = ours["intermediate_size"]
    assert difference(ours, architecture(wider)) == f"intermediate_size {2 * size} (this run: {size})"
    assert difference(ours, architecture(retokenized)) == "tokenizer"


def test_difference_names_at_most_three_keys():
    ours = {k: 1 for k in "abcde"}
    assert difference(ours, {k: 2 for k in "abcde"}) == ("a 2 (this run: 1), b 2 (this run: 1), "
                                                          "c 2 (this run: 1) and 2 more")


def test_advertised_address():
    assert advertised_address("10.0.0.5:5001", None) == "10.0.0.5:5001"
    assert advertised_address("0.0.0.0:5001", "node7") == "node7:5001"
    assert advertised_address("0.0.0.0:5001", "node7:6000") == "node7:6000"
    # a wildcard bind gives the address of the interface that routes to the controller
    assert advertised_address("0.0.0.0:5001", None, towards="127.0.0.1:50050") == "127.0.0.1:5001"
    assert advertised_address("0.0.0.0:5001", None) == f"{socket.getfqdn()}:5001"  # nothing to route to


def test_a_joined_replica_announces_the_address_it_gave_the_controller(tmp_path):
    """A replica bound to 0.0.0.0 (a container) first announces its bind address; once it knows the
    address it joins with, its announcement says that one, so `rlfleet status` finds it there
    instead of listing an unreachable 0.0.0.0 twin (seen with compose --scale rollout=2)."""
    path = announce(tmp_path, "rollout", "0.0.0.0:50051", 9100, name="rollout-c1-6")
    reannounce(tmp_path, "rollout-c1-6", "10.89.0.5:50051")
    info = json.loads(path.read_text())
    assert info["address"] == "10.89.0.5:50051"
    assert (info["role"], info["name"], info["metrics_port"]) == ("rollout", "rollout-c1-6", 9100)
    assert sorted(p.name for p in (tmp_path / "services").iterdir()) == ["rollout-c1-6.json"]
