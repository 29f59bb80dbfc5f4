"""The prompt journal's lines (controller/journal.py): each is in the file as soon as it is recorded (the
audit, `rlfleet status` and the e2e tests read the file while the run goes on; a killed controller loses
no line it recorded), whole when threads record at once, and still read by departed_replicas whether
written compact (orjson, issue 44) or as json.dumps wrote them before."""
from __future__ import annotations

import json
import threading

import pytest

from controller.journal import Journal, audit, departed_replicas, read_journal

pytestmark = pytest.mark.unit


def test_a_recorded_line_is_in_the_file_before_record_returns(tmp_path):
    journal = Journal(tmp_path)
    journal.record("dispatched", seq=3, prompt_index=17, version=2, replica="h:1")
    [line] = journal.path.read_text().splitlines()  # not closed, not flushed by anyone else
    entry = json.loads(line)
    assert entry.pop("t") > 0
    assert entry == {"event": "dispatched", "seq": 3, "prompt_index": 17, "version": 2, "replica": "h:1"}
    journal.close()


def test_rows_recorded_at_once_are_a_line_each_in_order_in_the_file_when_it_returns(tmp_path):
    journal = Journal(tmp_path)
    journal.record("dispatched", seq=0, version=1, replica="h:1")
    journal.record_all("trained", [{"seq": s, "step": 4, "version": 3, "generation_version": 2}
                                   for s in range(3)])
    journal.record_all("trained", [])  # nothing to write
    entries = read_journal(journal.path)
    assert [(e["event"], e["seq"]) for e in entries] == [("dispatched", 0), ("trained", 0), ("trained", 1),
                                                         ("trained", 2)]
    assert all(e["t"] > 0 and e.get("step", 4) == 4 for e in entries)
    journal.close()
    journal.record_all("trained", [{"seq": 9}])  # after close: dropped
    assert len(read_journal(journal.path)) == 4


def test_lines_recorded_by_many_threads_at_once_are_whole(tmp_path):
    journal = Journal(tmp_path)

    def record(thread: int) -> None:
        for seq in range(500):
            journal.record("generated", seq=thread * 1000 + seq, version=1, replica=f"host-{thread}:50051")
    threads = [threading.Thread(target=record, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    journal.close()
    seqs = sorted(e["seq"] for e in read_journal(journal.path))  # every line parses
    assert seqs == sorted(t * 1000 + s for t in range(8) for s in range(500))


def test_a_line_recorded_after_close_is_dropped(tmp_path):
    journal = Journal(tmp_path)
    journal.record("trained", seq=0, step=1, version=1)
    journal.close()
    journal.record("trained", seq=1, step=1, version=1)  # a daemon thread after the run's end
    assert [e["seq"] for e in read_journal(journal.path)] == [0]


def test_departed_replicas_reads_old_and_new_lines_alike(tmp_path):
    """A run resumed from a journal written before the compact lines appends to it."""
    old = [{"event": "join_accepted", "t": 1.0, "replica": "a:1", "name": "a"},
           {"event": "left", "t": 2.0, "replica": "a:1", "name": "a", "reason": "unreachable"},
           {"event": "left", "t": 3.0, "replica": "b:1", "name": "b", "reason": "drained"}]
    folder = tmp_path / "journal"
    folder.mkdir()
    (folder / "prompts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in old))
    journal = Journal(tmp_path)
    journal.record("join_accepted", replica="b:1", name="b")
    journal.record("left", replica="c:1", name="c", reason="sigterm")
    journal.close()
    assert departed_replicas(journal.path) == {"a:1": "unreachable", "c:1": "sigterm"}
    assert audit(journal.path).lost == []
