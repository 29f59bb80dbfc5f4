"""`algorithm.plugins=[bench.fleetsim.plugin]` registers the simulated GPU as `rollout.backend=sim`.
By import path, so a process that only checks the config (the controller) never imports the engine."""
from rlfleet.extensions import ROLLOUT_ENGINES

if "sim" not in ROLLOUT_ENGINES:
    ROLLOUT_ENGINES.register_path("sim", "bench.fleetsim.engine:create_engine")
