"""The revisions of the environment contract (protos/rlfleet/v1/environment.proto).

Revision 2 changed what some points meant inside rlfleet.v1 (docs/environments.md#contract-revisions
lists every change): a server reports the revision it was written against in
DescribeResponse.contract_revision, `rlfleet env check` prints it, and where a server's older behaviour
is harmless to the rollout the check says WARN, naming the revision that changed it.
"""
from __future__ import annotations

CONTRACT_REVISION = 3  # the revision this code implements and checks against
# Revision 2 decided the points the first text left open or said otherwise: a second Start of a running
# episode is refused (it restarted the episode), an observation with both fields uses the text (the
# messages), the End reasons max_turns/length/failed/aborted (token_budget, generation_failed), an empty
# arguments_json is {} (not JSON), Start answers no reward.
DECIDED = 2
REVISION_DATES = {1: "2026-12-01", 2: "2026-12-02", 3: "2026-12-05"}


def since(revision: int) -> str:
    """How a check names the revision that changed a point: "revision 2, 2026-12-02"."""
    return f"revision {revision}, {REVISION_DATES[revision]}"
