"""The `rlfleet` command."""
from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import signal
import sys
import threading

from rlfleet.app import config_show, eval_command, fleet_cli, health_cli, plot, samples_cli, sft_command
from rlfleet.app.interrupt import Interrupted, StopOnSignal
from rlfleet.cpu_threads import limit_threads
from rlfleet.data import command as data_command
from rlfleet.errors import FleetRefused, RlfleetError
from rlfleet.logging import setup_command_logging
from rlfleet.models import command as model_command


REFUSED_EXIT = 78  # = rlfleet.rpc.service_main.LOAD_FAILED_EXIT (sysexits' EX_CONFIG)
# Importing torch and transformers makes ~350k objects, and the cyclic collector's six full passes over
# them during the import took ~1 s of the ~5 s of CPU that a rollout or learner spends starting. With a
# full pass after 100 collections of the middle generation instead of 10, none ran during the import
# (~0.25 s of collecting left). The young generations are collected as before, so short-lived cycles
# are still freed at once; the old ones, which grow by loading, are scanned rarely.
FULL_COLLECTION_AFTER = 100
# The commands that compute in their own process: their torch threads are chosen as the services' are
# (rlfleet/cpu_threads.py). `run` and `serve` hand each service its count themselves.
COMPUTING_COMMANDS = frozenset({"sft", "eval", "data", "model", "build-model"})


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="job YAML file (default: the embedded default job)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides, e.g. learner.lr=1e-6 controller.max_staleness=2")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlfleet", description="Asynchronous GRPO across independent "
                                     "services")
    sub = parser.add_subparsers(dest="command", required=True)
    _config_args(sub.add_parser("run", help="start every service and train"))
    serve = sub.add_parser("serve", help="run one service")
    serve.add_argument("role", choices=["rollout", "reward", "learner"])
    serve.add_argument("--name", help="name in logs and in RUN_DIR/services/ (default: the role; "
                       "rollout replicas are rollout, rollout-1, …)")
    serve.add_argument("--index", type=int, default=0, help="replica index: picks the GPU under device=auto")
    serve.add_argument("--join", metavar="CONTROLLER_HOST:PORT", help="rollout only: join the fleet of a "
                       "running job (the controller's address is in `rlfleet status RUN_DIR --json`)")
    serve.add_argument("--advertise", metavar="HOST[:PORT]", help="with --join: the address the controller "
                       "reaches this replica at (default: rollout.host, or this machine's name when it "
                       "binds 0.0.0.0)")
    _config_args(serve)
    _config_args(sub.add_parser("controller", help="run the GRPO loop against running services "
                                "(rollout.address=… reward.address=… learner.address=…)"))
    status = sub.add_parser("status", help="show every service of a run: address, health, policy version, "
                            "load, in-flight work, last error")
    status.add_argument("run_dir", help="the run folder (<output_dir>/<name>)")
    status.add_argument("--json", action="store_true", help="print the rows as JSON")
    status.add_argument("--config", "-c", help="job YAML whose `security` (TLS, token) to use "
                        "(default: RUN_DIR/config.yaml when present)")
    status.add_argument("--prometheus-sd", metavar="FILE", help="also write the services' /metrics addresses "
                        "as a Prometheus file_sd targets file (see deploy/prometheus/)")
    sub.add_parser("build-model", help="build (or find cached) the embedded tiny model; prints its folder")
    from rlfleet.app.reward_cli import add_reward_parser
    add_reward_parser(sub)
    from rlfleet.app.env_cli import add_env_parser
    add_env_parser(sub)
    data_command.add_parser(sub)
    eval_command.add_parser(sub)
    sft_command.add_parser(sub)
    model_command.add_parser(sub)
    plot.add_parser(sub)
    samples_cli.add_parser(sub)
    health_cli.add_parser(sub)
    config_show.add_parser(sub)
    fleet_cli.add_parser(sub)
    return parser


def _load(args: argparse.Namespace):
    from rlfleet.config import load_config
    return load_config(args.config, args.overrides)


def _security_of(config: str | None, run_dir: str | None = None):
    """`rlfleet status`/`health`: the `security` of --config, else of RUN_DIR/config.yaml when it exists,
    else plain gRPC."""
    from pathlib import Path

    from rlfleet.rpc.security import Security

    if config is None and run_dir is not None and (Path(run_dir) / "config.yaml").is_file():
        config = str(Path(run_dir) / "config.yaml")
    if config is None:
        return Security()
    from rlfleet.config import load_config
    cfg = load_config(config)
    return Security.from_config(cfg.security, cfg.limits)


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        from rlfleet.app.launch import run_job
        run_job(_load(args))
    elif args.command == "serve":
        from rlfleet.app.serve import SERVERS, serve_rollout
        if args.join and args.role != "rollout":
            raise RlfleetError("--join is for `rlfleet serve rollout` only")
        if args.join:  # a joiner's default name differs from the run's replicas' and other joiners'
            import socket
            name = args.name or f"rollout-{socket.gethostname().split('.')[0]}-{os.getpid()}"
            serve_rollout(_load(args), name=name, index=args.index, join=args.join, advertise=args.advertise)
        else:
            SERVERS[args.role](_load(args), name=args.name or args.role, index=args.index)
    elif args.command == "controller":
        cfg = _load(args)
        missing = [r for r in ("reward", "learner") if not getattr(cfg, r).address]
        if missing:
            raise RlfleetError("rlfleet controller needs "
                               + " ".join(f"{r}.address=HOST:PORT" for r in missing))
        from controller.main import run_controller
        from rlfleet.app.progress import StepProgress
        from rlfleet.logging import setup_logging
        setup_logging("controller", cfg.run.log_level, cfg.run.dir / "logs" / "controller.log",
                      run=cfg.run.name)
        addresses = {r: getattr(cfg, r).address for r in ("rollout", "reward", "learner")
                     if getattr(cfg, r).address}
        if not (cfg.rollout.address or cfg.rollout.addresses):
            print("rlfleet: no rollout.address: the controller waits for rollout replicas to join "
                  "(`rlfleet serve rollout --join CONTROLLER_HOST:PORT`)", flush=True)
        from rlfleet.app.launch import replica_names
        addresses.update(zip(replica_names(len(cfg.rollout.addresses) + 1)[1:], cfg.rollout.addresses))
        with StopOnSignal(threading.Event()) as signals:  # the loop stops at its next check
            progress = StepProgress(cfg.controller.max_steps, run_dir=cfg.run.dir)
            run_controller(cfg, addresses, stop=signals.stop,
                           on_step=lambda m: print("\n".join(progress.lines(m)), flush=True))
        if progress.summary():
            print(progress.summary(), flush=True)
    elif args.command == "status":
        from rlfleet.app.status import print_status
        return print_status(args.run_dir, as_json=args.json, prometheus_sd=args.prometheus_sd,
                            security=_security_of(args.config, args.run_dir))
    elif args.command == "data":
        if args.kind == "traces":  # plays an environment: the composition root's
            from rlfleet.app import traces_command

            return traces_command.run(args)
        return data_command.run(args)
    elif args.command == "eval":
        return eval_command.run(args)
    elif args.command == "sft":
        return sft_command.run(args, args.argv)
    elif args.command == "model":
        return model_command.run(args)
    elif args.command == "plot":
        return plot.run(args)
    elif args.command == "samples":
        return samples_cli.run(args)
    elif args.command == "reward":
        from rlfleet.app.reward_cli import run_reward_command
        return run_reward_command(args)
    elif args.command == "env":
        from rlfleet.app.env_cli import run_env_command
        return run_env_command(args)
    elif args.command == "health":
        return health_cli.run(args, _security_of(getattr(args, "config", None)))
    elif args.command == "fleet":
        return fleet_cli.run(args, _security_of(args.config, args.run))
    elif args.command == "config":
        return config_show.run(args)
    elif args.command == "build-model":
        from rlfleet.models.tiny import ensure_tiny_model
        print(ensure_tiny_model())
    return 0


def _stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's stack to stderr (a service's log file under `rlfleet run`):
    the first thing to look at when a process seems stuck."""
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, ValueError, OSError):
        pass  # stderr is not a file (main() called in-process, e.g. tests)


def main(argv: list[str] | None = None) -> int:
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)
    _stacks_on_sigusr1()
    parser = build_parser()
    # argparse cannot take positionals on both sides of an option (`serve ROLE --config F k=v`):
    # collect the stray key=value items as overrides.
    args, extra = parser.parse_known_args(argv)
    stray = [item for item in extra if "=" not in item or item.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `rlfleet sft` restarts itself under torchrun
    if args.command in COMPUTING_COMMANDS:
        limit_threads()
        setup_command_logging(args.command)
    try:
        code = dispatch(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:  # `rlfleet status RUN | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Interrupted as exc:
        print(f"rlfleet: interrupted ({exc}); stopped cleanly", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # a second Ctrl-C: `rlfleet run` still stops its services on the way out
        print("rlfleet: interrupted", file=sys.stderr)
        return 130
    except RlfleetError as exc:
        print(f"rlfleet: error: {exc}", file=sys.stderr)
        # A replica refused by the run's controller (token, model) would be refused again: systemd and
        # Slurm do not restart on this code (as for a service whose load failed for good).
        return REFUSED_EXIT if isinstance(exc, FleetRefused) else 2


if __name__ == "__main__":
    sys.exit(main())
