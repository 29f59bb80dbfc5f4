"""The `containers` tests' time budget: pytest-timeout times the test body only (func_only).

Their fixtures build images (the base and CPU images took 474 s on a fresh machine, the systemd image
more) and bring stacks up and down; each of those commands has a timeout of its own
(tests/deploy/podman_host.py, compose_stack.py, test_systemd_run.py), so a first run on a fresh machine
is not failed by the build it has to do once (issue 32), and nothing waits for ever.
"""
from __future__ import annotations

import pytest

CONTAINER_TEST_BODY_S = 600  # the second run of the three took 311 s in all (issue 32)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("containers") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(CONTAINER_TEST_BODY_S, func_only=True))
