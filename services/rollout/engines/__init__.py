"""Rollout engines, one module each (hf.py, vllm.py), each implementing
services.rollout.engine.RolloutEngine with a `create_engine` factory. `rollout.backend` names one
of rlfleet.extensions.ROLLOUT_ENGINES, where every engine is registered by the import path of its
factory, so `rlfleet serve rollout` has no `if backend == ...` chain and the config is checked
without importing this role."""
