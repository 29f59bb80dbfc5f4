"""Optional experiment trackers that receive every metrics line (see `tracking` in the config).

A sink has `log(metrics)` and `close()`; RunWriter calls them after writing
metrics.jsonl and TensorBoard. Weights & Biases is imported only when enabled.
"""

from __future__ import annotations

import math
from typing import Any

from rlfleet.config import JobConfig
from rlfleet.errors import ConfigError


class WandbSink:
    def __init__(self, cfg: JobConfig):
        try:
            import wandb
        except ImportError:
            raise ConfigError(
                "tracking.wandb = true needs the wandb package: "
                "pip install 'rlfleet[wandb]' (or set tracking.wandb=false)"
            ) from None
        t = cfg.tracking
        cfg.run.dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=t.wandb_project,
            entity=t.wandb_entity,
            name=cfg.run.name,
            dir=str(cfg.run.dir),
            mode=t.wandb_mode,
            config=cfg.model_dump(mode="json"),
        )

    def log(self, metrics: dict[str, Any]) -> None:
        values = {
            k: v
            for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        self._run.log(values, step=int(metrics["step"]))

    @property
    def summary(self) -> dict[str, Any]:
        return dict(self._run.summary)

    def close(self) -> None:
        self._run.finish()


def make_sinks(cfg: JobConfig) -> list[Any]:
    return [WandbSink(cfg)] if cfg.tracking.wandb else []
