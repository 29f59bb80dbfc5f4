"""One vLLM engine for the tests of this folder: starting one takes ~13 s on two cores."""
from __future__ import annotations

import pytest


# Package scope: the engine (and its busy worker process) ends with this folder's last test, not at the
# end of the session, which under pytest-xdist may run many other tests on the same worker after them.
@pytest.fixture(scope="package")
def vllm_engine():
    """VLLMEngine on the built-in tiny model (CPU, float32). Tests that change its weights push them
    through a weight group of their own; each reads the policy version it finds, none assumes 0."""
    import torch

    from rlfleet.config import RolloutConfig
    from rlfleet.models.tiny import ensure_tiny_model
    from services.rollout.engines.vllm import VLLMEngine

    engine = VLLMEngine(ensure_tiny_model(), torch.device("cpu"), torch.float32,
                        RolloutConfig(max_batch_sequences=16), seed=0)
    yield engine
    engine.close()
