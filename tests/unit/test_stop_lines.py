"""What a stopped run says (issue 32, from a new user's Ctrl-C).

The stop line said "stopped after step 13" while its own fields said `step=14` (the step in progress,
bound for every line of that step), and a stop before any step had finished said "checkpointing the
last finished step". Now the fields are the step the line is about, and a stop with nothing finished
says there is nothing to checkpoint."""
from __future__ import annotations

import pytest
import structlog
import structlog.testing

from rlfleet.app.launch import stopping_line
from tests.unit.test_loop_recovery import Faults, make_loop

pytestmark = [pytest.mark.unit]


def test_the_stop_lines_fields_name_the_step_it_checkpointed(tmp_path):
    loop, learner = make_loop(tmp_path, Faults(), staleness=0)
    learner.version = 13
    loop.step = 13  # step 13 finished; step 14 was in progress when the stop came
    structlog.contextvars.bind_contextvars(step=14, policy_version=13)
    try:
        with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            loop._checkpoint_on_stop(13)
    finally:
        structlog.contextvars.unbind_contextvars("step", "policy_version")
        loop.journal.close()
        loop.writer.close()
    [line] = [e for e in logs if e["event"].startswith("stopped after step")]
    assert line["event"].startswith("stopped after step 13;") and line["step"] == 13, line


def test_a_stop_before_any_step_does_not_promise_a_checkpoint():
    assert "checkpointing the last finished step" in stopping_line(last_step=3)
    early = stopping_line(last_step=None)
    assert "checkpointing" not in early and "no step has finished" in early, early
