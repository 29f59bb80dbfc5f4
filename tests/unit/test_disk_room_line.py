"""The suite's first line on the temp folder's free space (tests/disk_room.py): a disk too small for the
suite's peak is named before the run, not found as INTERNALERROR and tests erroring in their setup."""
import pytest

from tests.disk_room import SUITE_PEAK_GIB, disk_room_line

pytestmark = pytest.mark.unit

GIB = 2**30


def test_room_enough_says_how_much():
    assert disk_room_line(20 * GIB, "/tmp") == "disk: 20.0 GiB free under /tmp"


def test_too_little_room_is_a_warning_naming_the_folder_and_the_need():
    line = disk_room_line(int(2.5 * GIB), "/scratch")
    assert line.startswith("WARNING: 2.5 GiB free under /scratch"), line
    assert f"~{SUITE_PEAK_GIB:g} GiB" in line, line


def test_the_threshold_is_the_suite_s_peak():
    assert disk_room_line(int(SUITE_PEAK_GIB * GIB), "/tmp").startswith("disk:")
    assert disk_room_line(int(SUITE_PEAK_GIB * GIB) - 1, "/tmp").startswith("WARNING")
