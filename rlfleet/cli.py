"""The `rlfleet` command."""
from __future__ import annotations

import argparse
import sys

from rlfleet.errors import RlfleetError


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="job YAML file (default: the embedded default job)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides, e.g. learner.lr=1e-6 controller.max_staleness=2")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlfleet", description="Asynchronous GRPO across independent services")
    sub = parser.add_subparsers(dest="command", required=True)
    _config_args(sub.add_parser("run", help="start every service and train"))
    serve = sub.add_parser("serve", help="run one service")
    serve.add_argument("role", choices=["rollout", "reward", "learner"])
    _config_args(serve)
    _config_args(sub.add_parser("controller", help="run the GRPO loop against running services "
                                "(rollout.address=… reward.address=… learner.address=…)"))
    status = sub.add_parser("status", help="show the services of a run")
    status.add_argument("run_dir", help="the run folder (<output_dir>/<name>)")
    sub.add_parser("build-model", help="build (or find cached) the embedded tiny model; prints its folder")
    return parser


def _load(args: argparse.Namespace):
    from rlfleet.config import load_config
    return load_config(args.config, args.overrides)


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        from rlfleet.launch import run_job
        run_job(_load(args))
    elif args.command == "serve":
        from rlfleet.serve import SERVERS
        SERVERS[args.role](_load(args))
    elif args.command == "controller":
        cfg = _load(args)
        missing = [r for r in ("rollout", "reward", "learner") if not getattr(cfg, r).address]
        if missing:
            raise RlfleetError("rlfleet controller needs " + " ".join(f"{r}.address=HOST:PORT" for r in missing))
        from controller.main import run_controller
        from rlfleet.launch import format_progress
        from rlfleet.logging import setup_logging
        setup_logging("controller", cfg.run.log_level, cfg.run.dir / "logs" / "controller.log")
        run_controller(cfg, {r: getattr(cfg, r).address for r in ("rollout", "reward", "learner")},
                       on_step=lambda m: print(format_progress(m, cfg.controller.max_steps), flush=True))
    elif args.command == "status":
        from rlfleet.status import print_status
        return print_status(args.run_dir)
    elif args.command == "build-model":
        from rlfleet.models.tiny import ensure_tiny_model
        print(ensure_tiny_model())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # argparse cannot take positionals on both sides of an option (`serve ROLE --config F k=v`):
    # collect the stray key=value items as overrides.
    args, extra = parser.parse_known_args(argv)
    stray = [item for item in extra if "=" not in item or item.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return dispatch(args)
    except KeyboardInterrupt:
        print("rlfleet: interrupted; services stopped", file=sys.stderr)
        return 130
    except RlfleetError as exc:
        print(f"rlfleet: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
