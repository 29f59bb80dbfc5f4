"""Turn a Python function into an rlfleet reward server.

    from rlfleet.app.reward_sdk import serve

    def score(data_source, solution_str, ground_truth, extra_info):
        return float(solution_str.strip() == ground_truth)

    serve(score, port=50051)            # blocks until SIGTERM / Ctrl-C

The server implements `rlfleet.v1.Reward` (see docs/reward-api.md) with the
contract's rules built in: one result per item in order, ok=false with the
error for an item whose function raised or returned a non-finite number, ids
checked, scoring stopped when the caller's deadline passes. It also serves
`grpc.health.v1` (SERVING once started) and server reflection.

`batched=True` hands the function the whole batch instead:
`fn(items: list[ScoreItem]) -> list[float | Exception]`, one entry per item.

From a shell: `rlfleet reward serve pkg.module:function --port 50051`
(or a built-in name: gsm8k, math, code, digits, …).
"""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

import yaml

from rlfleet.errors import RewardError
from rlfleet.types import ScoreItem, ScoreResult

__all__ = ["RewardServer", "ScoreItem", "serve"]


class BatchFunctionScorer:
    """Core for `batched=True`: one call of the user's function per request."""

    def __init__(self, fn: Callable[[list[ScoreItem]], list[Any]]):
        self.fn = fn

    def score(self, items: list[ScoreItem], active: Callable[[], bool] | None = None) -> list[ScoreResult]:
        from services.reward.scorer import check_items

        check_items(items)
        if not items:
            return []
        values = list(self.fn(items))
        if len(values) != len(items):
            raise RewardError(f"the batch reward function returned {len(values)} values for "
                              f"{len(items)} items")
        return [_result(item.id, value) for item, value in zip(items, values)]


def _result(item_id: str, value: Any) -> ScoreResult:
    if isinstance(value, BaseException):
        return ScoreResult(item_id, 0.0, ok=False, error=f"{type(value).__name__}: {value}")
    try:
        number = float(value["score"] if isinstance(value, dict) else value)
    except (TypeError, ValueError, KeyError) as exc:
        return ScoreResult(item_id, 0.0, ok=False, error=f"not a number: {value!r} ({exc})")
    if not math.isfinite(number):
        return ScoreResult(item_id, 0.0, ok=False, error=f"reward function returned {number}")
    return ScoreResult(item_id, number)


class RewardServer:
    """A running reward server; `address` is host:port as bound (port 0 picks a free one)."""

    def __init__(self, fn: Callable | str, host: str, port: int, params: dict[str, Any] | None,
                 batched: bool, max_workers: int, metrics_port: int | None):
        from rlfleet.proto.v1 import reward_pb2_grpc
        from rlfleet.rpc.server import ServiceServer
        from services.reward.scorer import RewardScorer
        from services.reward.servicer import SERVICE_NAME, RewardServicer

        core = BatchFunctionScorer(fn) if batched else RewardScorer(fn, params)
        self.servicer = RewardServicer()
        if metrics_port is not None:
            self.servicer.metrics_port = self.servicer.metrics.serve(host, metrics_port)
        self._server = ServiceServer([SERVICE_NAME], host, port, max_workers=max_workers)
        self._server.add(reward_pb2_grpc.add_RewardServicer_to_server, self.servicer)
        self._server.start()
        self.servicer.attach(core)
        self._server.mark_serving()

    @property
    def address(self) -> str:
        return self._server.address

    @property
    def port(self) -> int:
        return self._server.port

    def stop(self, grace_s: float = 5.0) -> None:
        self._server.stop(grace_s)

    def wait(self) -> None:
        self._server.wait()

    def __enter__(self) -> RewardServer:  # noqa: PYI034 - the class is not meant to be subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace_s=1.0)


def serve(fn: Callable | str, port: int = 0, host: str = "127.0.0.1", *, params: dict[str, Any] | None = None,
          batched: bool = False, max_workers: int = 8, metrics_port: int | None = None,
          block: bool = True) -> RewardServer:
    """Serves `fn` (a callable, a built-in name or 'pkg.module:function') as a reward server.

    `block=True` (the default) serves until SIGTERM or Ctrl-C; `block=False` returns the running
    server at once (`server.address`, `server.stop()`).
    """
    server = RewardServer(fn, host, port, params, batched, max_workers, metrics_port)
    if block:
        server._server.install_signal_handlers()
        print(f"rlfleet reward server: serving on {server.address}", flush=True)
        server.wait()
    return server


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="rlfleet reward serve")
    parser.add_argument("function", help="a built-in reward (gsm8k, math, code, digits, …) or "
                        "pkg.module:function")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument of the function (value parsed as YAML); repeatable")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics too")
    return parser


def serve_from_args(args: argparse.Namespace) -> None:
    from rlfleet.errors import ConfigError
    from rlfleet.logging import setup_logging

    params = {}
    for item in args.param:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r} is not KEY=VALUE")
        params[key] = yaml.safe_load(raw)
    setup_logging("reward", "info", None)
    serve(args.function, port=args.port, host=args.host, params=params, metrics_port=args.metrics_port)


if __name__ == "__main__":
    serve_from_args(build_parser().parse_args(sys.argv[1:]))
