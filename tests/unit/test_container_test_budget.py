"""The `containers` tests' pytest-timeout budget leaves out their fixtures' image builds.

Issue 32: on a fresh machine `make test-containers` failed because the compose test's module fixture
built the base and CPU images (474 s) inside the test's 600 s. Those builds have timeouts of their own
(tests/deploy/podman_host.py, test_systemd_run.py); the test's budget is for what the test does.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

DEPLOY_TESTS = Path(__file__).resolve().parents[1] / "deploy"


class _Budgets:
    def __init__(self):
        self.by_test: dict[str, tuple] = {}

    def pytest_collection_finish(self, session):
        for item in session.items:
            marker = item.get_closest_marker("timeout")
            self.by_test[item.nodeid] = (marker.args, marker.kwargs) if marker else None


def test_every_container_test_times_its_body_only():
    budgets = _Budgets()
    code = pytest.main(["--collect-only", "-q", "-m", "containers", "-p", "no:cacheprovider",
                        str(DEPLOY_TESTS)], plugins=[budgets])
    assert code == 0
    assert len(budgets.by_test) >= 3, budgets.by_test  # compose run, compose scale, systemd units
    for nodeid, budget in budgets.by_test.items():
        assert budget is not None, f"{nodeid}: no timeout marker (the ini's 600 s would count the builds)"
        args, kwargs = budget
        assert kwargs.get("func_only") is True, f"{nodeid}: its budget counts its fixtures: {budget}"
        assert args and args[0] >= 600, f"{nodeid}: {budget}"
