"""The environment contract has revisions (issue 42, item 10).

The contract changed meaning inside rlfleet.v1 (revision 2 decided points the first text left open or
said otherwise: a second Start of a running episode is refused where it replaced the episode, text is
used when an observation has both fields where messages were, the End reasons were renamed, an empty
arguments_json is {}), and a server written against the first text failed `rlfleet env check` although
it trains. Now Describe reports the revision a server was written against and `env check` prints it;
where the old behaviour is harmless the check says WARN with the revision that changed it, and where
it is not (an End reason it refuses fails the episode) FAIL names the revision too. The proto's
comments and the checker agree: a reward on Start is ignored (WARN), both observation fields use the
text (WARN), done=true on Start fails the episode (FAIL).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.app.env_check import FAIL, PASS, WARN, check_server, format_table
from rlfleet.app.env_sdk import serve
from rlfleet.env.contract import CONTRACT_REVISION
from rlfleet.proto.v1 import environment_pb2 as pb
from rlfleet.proto.v1 import environment_pb2_grpc
from rlfleet.rpc.channel import open_channel
from tests.env_servers import start_revision_1

pytestmark = pytest.mark.service
REPO = Path(__file__).resolve().parents[2]


def by_name(checks):
    return {c.name: c for c in checks}


def test_describe_reports_the_revision_and_env_check_prints_it():
    assert CONTRACT_REVISION == 3  # 1: the first text; 2: the decided points; 3: Describe reports it
    with serve("digits_game", block=False) as server:
        channel = open_channel(server.address)
        try:
            reply = environment_pb2_grpc.EnvironmentStub(channel).Describe(pb.DescribeRequest(), timeout=10)
        finally:
            channel.close()
        checks = check_server(server.address)
        cli = subprocess.run([sys.executable, "-m", "rlfleet.app.cli", "env", "check", server.address],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert reply.contract_revision == 3
    revision = by_name(checks)["contract revision"]
    assert revision.result == PASS and revision.detail.startswith("3"), revision
    assert cli.returncode == 0, cli.stderr
    assert "contract revision 3" in cli.stdout.splitlines()[0], cli.stdout
    assert re.search(r"^contract revision\s+PASS\s+3", cli.stdout, re.MULTILINE), cli.stdout


def test_a_server_written_against_revision_1_passes_with_warnings_naming_revision_2():
    server = start_revision_1()
    try:
        checks = by_name(check_server(server.address))
    finally:
        server.stop(grace_s=0)
    assert [n for n, c in checks.items() if c.result == FAIL] == [], [c for c in checks.values()
                                                                      if c.result == FAIL]
    running = checks["Start of a running episode"]
    assert running.result == WARN and "revision 2" in running.detail, running
    empty = checks["empty arguments_json"]
    assert empty.result == WARN and "revision 2" in empty.detail and "INVALID_ARGUMENT" in empty.detail, empty
    episode = checks["one episode"]  # Start's reward and the observation with both fields
    assert episode.result == WARN and "revision 2" in episode.detail, episode
    assert "reward" in episode.detail and "both messages and text" in episode.detail, episode
    revision = checks["contract revision"]  # no Describe: the revision is unknown
    assert revision.result != FAIL and "not reported" in revision.detail, revision
    table = format_table(server.address, list(checks.values()))
    assert re.search(r"summary: \d+ PASS, 3 WARN, 0 FAIL", table), table


def test_an_end_reason_of_revision_1_only_fails_naming_the_rename():
    """Revision 2 renamed the End reasons (token_budget became length, generation_failed became failed or
    aborted). A server that refuses End(length) fails the episode, and its reward is lost: not harmless."""
    server = start_revision_1(end_reasons=True)
    try:
        checks = by_name(check_server(server.address))
    finally:
        server.stop(grace_s=0)
    end = checks["End"]
    assert end.result == FAIL and "revision 2" in end.detail and "token_budget" in end.detail, end


def test_the_proto_and_the_docs_name_the_current_revision():
    proto = (REPO / "protos" / "rlfleet" / "v1" / "environment.proto").read_text()
    docs = (REPO / "docs" / "environments.md").read_text()
    assert f"revision {CONTRACT_REVISION}" in proto
    assert "uint32 contract_revision = 4;" in proto
    for revision in range(1, CONTRACT_REVISION + 1):
        assert re.search(rf"^### Revision {revision}\b", docs, re.MULTILINE), revision
