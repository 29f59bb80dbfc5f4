"""Parse an `rlfleet …` argument list exactly as the `rlfleet` command does, and load its config.

Deployment files (compose.yaml, the systemd units, the Slurm script) spell rlfleet command lines;
these helpers run them through `rlfleet.app.cli.build_parser` and `rlfleet.config.load_config`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlfleet.app.cli import build_parser
from rlfleet.config import JobConfig, load_config


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """`rlfleet.app.cli.main`'s parsing: argparse, then stray `key=value` items become overrides."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    stray = [item for item in extra if "=" not in item or item.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        raise AssertionError(f"rlfleet would reject {argv}: unrecognized arguments {stray or extra}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def load_job(args: argparse.Namespace, config_path: str | Path | None = None) -> JobConfig:
    """The job config the command would run with; `config_path` replaces `--config` (a path as seen
    inside a container or on a deployment host, mapped to this checkout)."""
    return load_config(config_path if config_path is not None else args.config, args.overrides)


def overrides(args: argparse.Namespace) -> dict[str, str]:
    """The command's `key=value` overrides as a dict (the last one wins, as in load_config)."""
    return dict(item.split("=", 1) for item in args.overrides)
