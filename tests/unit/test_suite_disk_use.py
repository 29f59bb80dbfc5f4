"""The suite's own disk use: a passing test's tmp_path is removed when it ends.

The e2e tests that train SmolLM2 write GBs under tmp_path (the calculator phase ~3.6 GB of SFT and GRPO
checkpoints, the GSM8K recipe ~1.6 GB); kept for the whole run, and pytest keeps the last three runs, they
filled a CI machine's disk mid-run (stop 50: INTERNALERROR, 106 errors). pyproject's
`tmp_path_retention_policy = "failed"` keeps only the directories of tests that failed, for reading.
The two tests below run in file order on one worker (`--dist loadfile`).
"""

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_written: list[Path] = []


def test_a_passing_test_writes_into_its_tmp_path(tmp_path: Path) -> None:
    marker = tmp_path / "checkpoint.bin"
    marker.write_bytes(b"\0" * 1024)
    _written.append(tmp_path)


def test_the_passing_test_s_tmp_path_is_gone_when_the_next_test_runs() -> None:
    if not _written:
        pytest.skip("runs after test_a_passing_test_writes_into_its_tmp_path (selected alone here)")
    assert not _written[0].exists(), f"{_written[0]} kept after its test passed"
