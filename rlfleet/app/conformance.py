"""What `rlfleet reward check` and `rlfleet env check` share: a check's outcome, the checks every
server answers alike (health, an expected error code, reflection), running a checker's list of
checks in order, and the pass/fail table."""
from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.rpc.call_release import release_call
from rlfleet.rpc.channel import open_channel

PASS, WARN, FAIL, NA = "PASS", "WARN", "FAIL", "N/A"


@dataclass(frozen=True)
class Check:
    name: str
    result: str
    detail: str = ""


class Failed(Exception):
    """A check found the contract broken."""


class NotApplicable(str):
    """What a check returns for N/A with a detail (NA itself: N/A without one)."""


class ServerChecker:
    """A conversation with one server of the contract named by SERVICE: a subclass adds its stub,
    its requests and its CHECKS (name, method) in the order they run. A check that finds something
    the client copes with (an older revision's behaviour) calls warn(): it then says WARN."""

    SERVICE = ""
    CHECKS: tuple[tuple[str, Callable[[object], str]], ...] = ()

    def __init__(self, address: str, timeout_s: float, security=None):
        self.address, self.timeout_s = address, timeout_s
        self.channel = open_channel(address, security)
        self.warnings: list[str] = []  # of the check running now (run_checks empties it before each)
        self._warned: set[str] = set()

    def warn(self, message: str) -> None:
        """The check in progress found something harmless to the client that the contract now says
        otherwise. Said once, by the first check that finds it (every check that plays episodes
        would find a reward on Start again)."""
        if message not in self._warned:
            self._warned.add(message)
            self.warnings.append(message)

    def expect_code(self, call: Callable[[], object], code: grpc.StatusCode) -> str:
        try:
            call()
        except grpc.RpcError as err:
            if err.code() == code:
                return f"{code.name}: {err.details()}"[:90]
            raise Failed(f"expected {code.name}, got {err.code().name}: {err.details()}") from None
        raise Failed(f"expected {code.name}, got a normal reply")

    def optional(self, name: str, call: Callable[[], object]) -> object:
        """The reply of an optional RPC, or NA (this very object: compare with `is`) when the server
        does not implement it."""
        try:
            return call()
        except grpc.RpcError as err:
            code, details = err.code(), err.details()
            release_call(err)  # a refused stream (reflection) must not wait for the final collection
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return NA
        raise Failed(f"{name} failed with {code.name}: {details}")

    def check_health(self) -> str:
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise Failed(f"grpc.health.v1 Check failed: {err.code().name}: {err.details()}") from None
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        if status != "SERVING":
            raise Failed(f"health says {status}")
        return "SERVING"

    def check_reflection(self) -> str:
        from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
            ProtoReflectionDescriptorDatabase,
        )
        database = ProtoReflectionDescriptorDatabase(self.channel)
        services = self.optional("reflection", database.get_services)
        if services is NA:
            return NA
        if self.SERVICE not in services:
            raise Failed(f"reflection lists {sorted(services)}, not {self.SERVICE}")
        return f"lists {self.SERVICE}"

    def run(self) -> list[Check]:
        return run_checks(self, self.CHECKS)

    def close(self) -> None:
        """Closes the channel and frees, while grpc's threads still run, any call a check left in a
        reference cycle: at the interpreter's final collection freeing one can deadlock (issue 32)."""
        self.channel.close()
        gc.collect()


def run_checks(checker: object, checks: tuple[tuple[str, Callable[[object], str]], ...]) -> list[Check]:
    """Each check in order: PASS with its detail, N/A when it returns NA, FAIL with the reason. When
    the health check finds nothing answering, the others are not run (they would only repeat it)."""
    results = []
    for name, method in checks:
        warnings = getattr(checker, "warnings", None)
        if warnings is not None:
            warnings.clear()
        try:
            detail = method(checker)
            if detail != NA and warnings:
                results.append(Check(name, WARN, "; ".join(warnings)))
            else:
                skipped = detail == NA or isinstance(detail, NotApplicable)
                results.append(Check(name, NA if skipped else PASS, "" if detail == NA else str(detail)))
        except Failed as exc:
            results.append(Check(name, FAIL, str(exc)))
        except grpc.RpcError as err:
            results.append(Check(name, FAIL, f"{err.code().name}: {err.details()}"))
        if name == "health" and results[-1].result == FAIL and "UNAVAILABLE" in results[-1].detail:
            break
    return results


def format_table(kind: str, address: str, checks: list[Check], against: str = "") -> str:
    """`against`: what the server was checked against, said on the first line ("contract revision 3")."""
    width = max(len(c.name) for c in checks)
    lines = [f"{kind} server {address}" + (f", checked against {against}" if against else ""),
             f"{'check':<{width}}  result  detail"]
    lines += [f"{c.name:<{width}}  {c.result:<6}  {c.detail}" for c in checks]
    counts = {r: sum(c.result == r for c in checks) for r in (PASS, WARN, FAIL, NA)}
    warned = f"{counts[WARN]} WARN, " if counts[WARN] else ""  # WARN does not fail: exit 0
    lines.append(f"summary: {counts[PASS]} PASS, {warned}{counts[FAIL]} FAIL, {counts[NA]} N/A")
    return "\n".join(lines)
