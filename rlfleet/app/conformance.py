"""What `rlfleet reward check` and `rlfleet env check` share: a check's outcome, running a
checker's list of checks in order, and the pass/fail table."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc

PASS, FAIL, NA = "PASS", "FAIL", "N/A"


@dataclass(frozen=True)
class Check:
    name: str
    result: str
    detail: str = ""


class Failed(Exception):
    """A check found the contract broken."""


def run_checks(checker: object, checks: tuple[tuple[str, Callable[[object], str]], ...]) -> list[Check]:
    """Each check in order: PASS with its detail, N/A when it returns NA, FAIL with the reason. When
    the health check finds nothing answering, the others are not run (they would only repeat it)."""
    results = []
    for name, method in checks:
        try:
            detail = method(checker)
            results.append(Check(name, NA if detail == NA else PASS, "" if detail == NA else detail))
        except Failed as exc:
            results.append(Check(name, FAIL, str(exc)))
        except grpc.RpcError as err:
            results.append(Check(name, FAIL, f"{err.code().name}: {err.details()}"))
        if name == "health" and results[-1].result == FAIL and "UNAVAILABLE" in results[-1].detail:
            break
    return results


def format_table(kind: str, address: str, checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{kind} server {address}", f"{'check':<{width}}  result  detail"]
    lines += [f"{c.name:<{width}}  {c.result:<6}  {c.detail}" for c in checks]
    counts = {r: sum(c.result == r for c in checks) for r in (PASS, FAIL, NA)}
    lines.append(f"summary: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[NA]} N/A")
    return "\n".join(lines)
