"""learner.weight_backend=auto follows placement (rlfleet.devices.backend_for_placement)."""
from __future__ import annotations

import pytest
import torch

from rlfleet.devices import backend_for_placement, placement, weight_backend
from rlfleet.errors import ConfigError

LEARNER = "host-a/GPU-0000/ipc"


@pytest.mark.parametrize("members,gpus,expected", [
    (["host-a/GPU-0000/ipc"], 1, "ipc"),  # the rollout shares the learner's GPU and maps IPC buffers
    (["host-a/GPU-0000/ipc", "host-a/GPU-0000/ipc"], 1, "ipc"),  # two replicas on the one GPU
    (["host-a/GPU-0000"], 1, "gloo"),  # same GPU, an engine that cannot map IPC buffers: not NCCL
    (["host-a/GPU-1111/ipc"], 2, "nccl"),  # a GPU of its own on the same host
    (["host-b/GPU-2222/ipc"], 1, "nccl"),  # another host's GPU
    (["host-a/GPU-0000/ipc", "host-a/GPU-1111/ipc"], 2, "gloo"),  # one shares the GPU, one does not
    (["host-a/cpu"], 1, "gloo"),  # a rollout on the CPU
    (None, 1, "gloo"), (None, 2, "nccl"),  # no placements (an older controller): by GPU count
])
def test_auto_follows_placement(members, gpus, expected) -> None:
    assert backend_for_placement(LEARNER, members, gpus) == expected


def test_explicit_backends_and_the_cpu() -> None:
    cpu = torch.device("cpu")
    assert weight_backend("auto", cpu, ["x/cpu"]) == "gloo"
    assert weight_backend("gloo", cpu) == "gloo"
    for spec in ("nccl", "ipc"):
        with pytest.raises(ConfigError, match=f"weight_backend = '{spec}' needs the learner on a GPU"):
            weight_backend(spec, cpu)
    assert placement(cpu, ipc_capable=True).endswith("/cpu")  # IPC is a GPU capability only
