"""Which heavy modules each role has imported once it serves (issue 26: lean on small jobs).

Each role's real entry runs in a fresh interpreter (`rlfleet serve ROLE` through rlfleet.app.cli,
and the launcher+controller's start-up path: the model check, the prompt tokenizer, the prompts,
the advantage estimator, the run's writer); when the service says SERVING a thread inside it
reports sys.modules.
The roles that do no tensor work (controller, reward service with rule-based rewards) must not
import torch or transformers' models: ~250 MB and a second or more of start-up each. The launcher+
controller must not import torch for its TensorBoard scalars either (`torch.utils.tensorboard`: ~190
MB and 2.4 s, on by default), nor pandas (~45 MB: pyarrow imports it when it converts Python objects
or reads through pyarrow.dataset). The rollout and learner on the CPU import torch and transformers
but not Triton (~70 MB each, a GPU kernel compiler that torch._dynamo loads whenever it is installed),
and without security.token not the cryptography package (~6 MB each).
A module that is marked absent (`sys.modules[name] = None`) is not counted as imported.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers.modeling_utils", "numpy", "sympy", "math_verify", "multiprocessing.pool")

SERVICE = textwrap.dedent("""
    import json, os, sys, threading, time
    from rlfleet.rpc.channel import health_status, open_channel
    out, run_dir, role = sys.argv[1], sys.argv[2], sys.argv[3]

    def report_when_serving():
        path = os.path.join(run_dir, "services", role + ".json")
        while True:
            if os.path.exists(path):
                channel = open_channel(json.load(open(path))["address"])
                if health_status(channel) == "SERVING":
                    break
            time.sleep(0.05)
        json.dump(sorted(name for name, module in list(sys.modules.items()) if module is not None),
                  open(out, "w"))
        os._exit(0)

    threading.Thread(target=report_when_serving, daemon=True).start()
    from rlfleet.app.cli import main
    main(["serve", role, f"run.output_dir={os.path.dirname(run_dir)}",
          f"run.name={os.path.basename(run_dir)}", *sys.argv[4:]])
""")

CONTROLLER = textwrap.dedent("""
    import json, sys
    from rlfleet.config import load_config
    from rlfleet.models.resolve import resolve_model_path
    import rlfleet.app.launch
    from controller.main import prompt_length_limit, train_files
    from controller.outputs import RunWriter
    from controller.sample_builder import SampleBuilder
    from controller.tracking import make_sinks
    from rlfleet.advantages import ADVANTAGE_ESTIMATORS
    from rlfleet.data.prompts import load_prompts
    from rlfleet.models.prompt_tokenizer import load_prompt_tokenizer
    out, run_dir = sys.argv[1], sys.argv[2]
    cfg = load_config(None, [f"run.output_dir={run_dir}", "run.name=c"])
    model_dir = resolve_model_path(cfg.model.path)
    limit = prompt_length_limit(cfg, model_dir)
    prompts, _ = load_prompts(train_files(cfg), load_prompt_tokenizer(model_dir), "prompt", limit)
    assert prompts
    assert ADVANTAGE_ESTIMATORS.get(cfg.algorithm.advantage).group_advantages([1.0, 0.0])[0] > 0
    assert cfg.tracking.tensorboard  # the default: TensorBoard scalars are written
    writer = RunWriter(cfg.run.dir, tensorboard=cfg.tracking.tensorboard, sinks=make_sinks(cfg))
    writer.log_metrics({"step": 1, "reward/mean": 0.5})
    writer.close()
    json.dump(sorted(name for name, module in list(sys.modules.items()) if module is not None),
              open(out, "w"))
""")


def modules_of(script: str, *args: str, tmp_path: Path) -> set[str]:
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", script, str(out), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert out.exists(), proc.stderr[-2000:]
    return set(json.loads(out.read_text()))


def heavy(modules: set[str]) -> list[str]:
    return [name for name in HEAVY if name in modules]


def test_the_reward_service_with_built_in_rules_imports_no_torch(tmp_path: Path) -> None:
    modules = modules_of(SERVICE, str(tmp_path / "run"), "reward", tmp_path=tmp_path)
    assert heavy(modules) == [], heavy(modules)


def test_the_launcher_and_controller_start_up_imports_no_torch(tmp_path: Path) -> None:
    # The run folder is fresh: the start-up also writes the built-in task's Parquet file.
    modules = modules_of(CONTROLLER, str(tmp_path), tmp_path=tmp_path)
    forbidden = {"torch", "transformers.modeling_utils", "sympy", "pandas"}
    assert not forbidden & modules, sorted(forbidden & modules)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["rollout", "learner"])
def test_the_roles_that_do_tensor_work_import_torch_but_on_cpu_no_triton(tmp_path: Path, role: str) -> None:
    modules = modules_of(SERVICE, str(tmp_path / "run"), role, f"{role}.device=cpu", tmp_path=tmp_path)
    assert "torch" in modules and "transformers.modeling_utils" in modules
    # AES-GCM seals the weight group's rendezvous only under security.token (off by default): ~6 MB
    assert "cryptography" not in modules
    if importlib.util.find_spec("triton") is not None:  # installed (torch's CUDA build, vLLM): kept out
        assert "triton" not in modules, sorted(m for m in modules if m.split(".")[0] == "triton")[:5]
