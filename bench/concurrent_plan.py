"""Several `rlfleet run`s on one GPU, checked before they start: each run's memory plan (the estimate
rlfleet/app/gpu_plan.py checks against the run's rollout and learner shares) and the shares of all runs
together, plus what the other processes beside them are allowed (TRL, evaluations), within the GPU.

    python bench/concurrent_plan.py --config deploy/configs/arithmetic-smollm2-135m.yaml \\
        --model-dir MODEL --runs 6 --others-gib 0 --gpu-gib 139 $(grep -v '^#' bench/concurrent_runs.args)

Why: each run caps its own allocators at its shares and never looks at the memory other processes
hold, so N runs whose shares add up past the GPU start fine and fail minutes later in one of them.
--model-dir defaults to SmolLM2-135M's shape (the one-GPU session's model); --gpu-gib to the
H200's ~139 GiB, or the GPU's own size when CUDA is there.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# SmolLM2-135M-Instruct's config.json, the parts the plan reads (../shared/FACTS.md)
SMOLLM2_135M = {"num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536,
                "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                "tie_word_embeddings": True, "max_position_embeddings": 8192}
H200_GIB = 139.0


def plan(cfg, model_config: dict, gpu_bytes: int, runs: int, others_bytes: int, dtype_bytes: int = 2) -> dict:
    """Each run's estimates against its shares (ConfigError as the run itself would raise it), then
    ConfigError if runs x shares + others exceed the GPU. Returns the figures (GiB)."""
    from rlfleet.app.gpu_plan import learner_plan, rollout_plan
    from rlfleet.errors import ConfigError
    from rlfleet.memory_plan import GIB, MAX_SHARES, Shape

    # the plans each run makes in its two processes: unset shares derived as there, same refusals
    shape = Shape.from_config(model_config)
    shares, rollout = rollout_plan(cfg, shape, dtype_bytes, gpu_bytes, shared=True)
    _, _, learner = learner_plan(cfg, cfg.learner, shape, dtype_bytes, gpu_bytes, shared=True)
    rollout_share, learner_share = shares.rollout, shares.learner
    capped = runs * (rollout_share + learner_share) * gpu_bytes
    if capped + others_bytes > MAX_SHARES * gpu_bytes:
        raise ConfigError(
            f"{runs} runs x (rollout.gpu_memory_utilization {rollout_share:g} + "
            f"learner.gpu_memory_utilization {learner_share:g}) = {capped / GIB:.1f} GiB, plus "
            f"{others_bytes / GIB:.1f} GiB for the other processes, exceed {MAX_SHARES:g} of this "
            f"{gpu_bytes / GIB:.0f} GiB GPU; lower the shares or run fewer at once")
    return {"runs": runs, "gpu_gib": round(gpu_bytes / GIB, 1),
            "rollout": {"share": rollout_share,
                        "estimate_gib": round(sum(rollout.values()) / GIB, 2) if rollout else None},
            "learner": {"share": learner_share, "estimate_gib": round(sum(learner.values()) / GIB, 2)},
            "runs_capped_gib": round(capped / GIB, 1), "others_gib": round(others_bytes / GIB, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--model-dir", help="a model folder (its config.json); default: SmolLM2-135M's shape")
    p.add_argument("--runs", type=int, required=True, help="rlfleet runs at once")
    p.add_argument("--others-gib", type=float, default=0.0,
                   help="memory the other processes on the GPU may take (TRL, evaluations)")
    p.add_argument("--gpu-gib", type=float, default=None,
                   help=f"default: the GPU's size when CUDA is there, else an H200's {H200_GIB:g}")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)

    from rlfleet.config import load_config
    from rlfleet.errors import ConfigError
    from rlfleet.memory_plan import GIB

    try:
        cfg = load_config(args.config, args.overrides)
        model_config = (json.loads((Path(args.model_dir) / "config.json").read_text()) if args.model_dir
                        else SMOLLM2_135M)
        gpu_gib = args.gpu_gib
        if gpu_gib is None:
            gpu_gib = H200_GIB
            try:
                import torch

                if torch.cuda.is_available():
                    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB
            except ImportError:
                pass
        figures = plan(cfg, model_config, int(gpu_gib * GIB), args.runs, int(args.others_gib * GIB))
    except (ConfigError, OSError, ValueError) as exc:
        print(f"concurrent plan refused: {exc}", file=sys.stderr)
        return 1
    print("concurrent plan: " + json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
