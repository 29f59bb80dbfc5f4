"""`rlfleet env check ADDRESS` and `rlfleet env serve NAME|pkg.module:Class`."""
from __future__ import annotations

import argparse


def add_env_parser(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="environment servers (multi-turn episodes): check one against the "
                         "contract, or serve one")
    commands = env.add_subparsers(dest="env_command", required=True)
    check = commands.add_parser("check", help="exercise an environment server (health, episodes, batching, "
                                "deadlines, malformed requests) and print a pass/fail table; exit 1 on any "
                                "failure")
    check.add_argument("address", help="HOST:PORT of an rlfleet.v1.Environment server, or http://HOST:PORT "
                       "(ws://…) of an OpenEnv server (env.kind=openenv)")
    check.add_argument("--timeout", type=float, default=10.0, help="deadline of one call, seconds")
    check.add_argument("--row", default=None, metavar="JSON",
                       help='the data row episodes start from {"data_source", "prompt", "ground_truth", '
                       '"extra_info_json"} (default: a digits_reverse row)')
    check.add_argument("--action", action="append", default=[], metavar="TEXT",
                       help="a model turn to play; repeatable, played in order and cycled (default: a "
                       "calculator tool call, then an answer)")
    check.add_argument("--config", "-c", help="job YAML whose `security` (TLS, bearer token) reaches a "
                       "secured server (and checks that calls without the token are refused)")
    check.add_argument("--stop", type=int, default=None, metavar="PID",
                       help="the server's process id: the last check sends it SIGTERM and requires health "
                       "to say NOT_SERVING before the server goes (default: not checked)")
    from rlfleet.app.env_sdk import build_parser
    build_parser(commands.add_parser("serve", help="serve a built-in environment or pkg.module:Class "
                                     "(health and reflection included)"))


def run_env_command(args: argparse.Namespace) -> int:
    if args.env_command == "serve":
        from rlfleet.app.env_sdk import serve_from_args
        serve_from_args(args)
        return 0
    from rlfleet.app.env_check import FAIL, check_server, format_table, parse_row
    from rlfleet.app.openenv_check import is_openenv_address

    if is_openenv_address(args.address):
        from rlfleet.app import openenv_check

        checks = openenv_check.check_server(args.address, args.timeout, parse_row(args.row),
                                            args.action or None)
        print(openenv_check.format_table(args.address, checks), flush=True)
        return 1 if any(c.result == FAIL for c in checks) else 0
    security = None
    if args.config:
        from rlfleet.config import load_config
        from rlfleet.rpc.security import Security

        cfg = load_config(args.config)
        security = Security.from_config(cfg.security, cfg.limits)
    checks = check_server(args.address, args.timeout, parse_row(args.row), args.action or None, security,
                          args.stop)
    print(format_table(args.address, checks), flush=True)
    return 1 if any(c.result == FAIL for c in checks) else 0
