"""`rlfleet reward check ADDRESS` and `rlfleet reward serve FUNCTION`."""
from __future__ import annotations

import argparse


def add_reward_parser(sub: argparse._SubParsersAction) -> None:
    reward = sub.add_parser("reward", help="reward servers: check one against the contract, or serve a "
                            "function")
    commands = reward.add_subparsers(dest="reward_command", required=True)
    check = commands.add_parser("check", help="exercise a reward server (health, batching, deadlines, "
                                "malformed requests) and print a pass/fail table; exit 1 on any failure")
    check.add_argument("address", help="HOST:PORT of the reward server")
    check.add_argument("--timeout", type=float, default=10.0, help="deadline of one call, seconds")
    check.add_argument("--item", action="append", default=[], metavar="JSON",
                       help='a sample item {"data_source", "prompt", "response", "ground_truth", '
                       '"extra_info_json"}; repeatable (default: GSM8K-style items)')
    from rlfleet.app.reward_sdk import build_parser
    build_parser(commands.add_parser("serve", help="serve a reward function as a reward server "
                                     "(health and reflection included)"))


def run_reward_command(args: argparse.Namespace) -> int:
    if args.reward_command == "serve":
        from rlfleet.app.reward_sdk import serve_from_args
        serve_from_args(args)
        return 0
    from rlfleet.app.reward_check import FAIL, check_server, format_table, parse_items
    checks = check_server(args.address, args.timeout, parse_items(args.item) or None)
    print(format_table(args.address, checks), flush=True)
    return 1 if any(c.result == FAIL for c in checks) else 0
