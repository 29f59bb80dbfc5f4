"""Config of experiment tracking (the `tracking` section): where step metrics go besides metrics.jsonl.

`metrics.jsonl` is always written; TensorBoard is on by default; Weights & Biases
is used only when `tracking.wandb=true` (install it with `pip install 'rlfleet[wandb]'`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    tensorboard: bool = Field(True, description="write TensorBoard scalars to <run>/tensorboard/")
    wandb: bool = Field(False, description="also log every step's metrics to Weights & Biases")
    wandb_project: str = Field("rlfleet", min_length=1, description="W&B project")
    wandb_entity: str | None = Field(None, description="W&B entity (team or user); null: your default")
    wandb_mode: Literal["online", "offline"] = Field(
        "online", description="offline writes the run under <run>/wandb/ for a later `wandb sync`"
    )
