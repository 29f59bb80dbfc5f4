"""The layer rules that import-linter cannot see: what a module pulls in at import time."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

# The reward side (the reward service and the SDK third parties serve their functions with) runs on
# machines without torch; importing it must not load torch.
TORCH_FREE = (
    "services.reward.servicer",
    "services.reward.scorer",
    "services.reward.build",
    "rlfleet.rpc.validate",
    "rlfleet.app.reward_sdk",
    "rlfleet.app.reward_check",
)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_the_reward_side_does_not_import_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False", f"importing {module} imports torch"


def test_the_import_contract_places_every_core_module():
    """pyproject's layers contract names the core module by module (import-linter layers cannot be
    `rlfleet` minus `rlfleet.app`): a new module of rlfleet/ must be placed there, or it goes unchecked."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    [contract] = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    app, roles, core = contract["layers"]
    assert app == "rlfleet.app"
    # environments/ (the environment servers) sits beside the roles: it imports only the core, and the
    # roles meet it only through the environment contract.
    assert set(roles.split(" | ")) == {"controller", "services.rollout", "services.reward",
                                       "services.learner", "environments"}
    listed = {name.strip() for name in core.split(":")}
    present = {f"rlfleet.{p.stem}" for p in (root / "rlfleet").iterdir()
               if p.name != "app" and not p.name.startswith(("_", ".")) and (p.suffix == ".py" or p.is_dir())}
    assert listed == present, f"unplaced: {sorted(present - listed)}, gone: {sorted(listed - present)}"
