"""The controller scores every generated group waiting in one Score call (issue 26: one reward round
trip per step rather than one per group), and each group gets its own items' results back."""
from __future__ import annotations

import json
import threading

import pytest

from rlfleet.types import ScoreResult
from tests.unit.test_loop_recovery import Faults, FakeReward, make_loop, run_loop

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


class SlowFirstReward(FakeReward):
    """Scores an item by its prompt ("p7" -> 7.0); its first call returns only once `more_generated` is
    set (the controller has taken the next request's groups from the rollout too), so the groups after
    the first wait together."""

    def __init__(self, faults: Faults) -> None:
        super().__init__(faults)
        self.sizes: list[int] = []
        self.more_generated = threading.Event()

    def score(self, items):
        self.sizes.append(len(items))
        if len(self.sizes) == 1:
            assert self.more_generated.wait(30), "the controller took no further group while scoring"
        return [ScoreResult(item.id, float(item.prompt[1:])) for item in items]


def test_waiting_groups_are_scored_together_and_each_gets_its_own_results(tmp_path) -> None:
    loop, learner = make_loop(tmp_path, Faults(), staleness=1, steps=4)
    reward = SlowFirstReward(Faults())
    loop.reward = reward
    generate = loop.rollout.generate

    streams_done = []

    def generate_and_tell(requests, params, payload_sink=""):
        """A request's groups, then (once the controller asked past the last group of its second
        request) the event: the first request's second group and the second request's groups are
        then all waiting, whatever the order the threads and the event loop ran in."""
        yield from generate(requests, params, payload_sink)
        streams_done.append(len(requests))
        if len(streams_done) >= 2:
            reward.more_generated.set()

    loop.rollout.generate = generate_and_tell
    assert run_loop(loop) is None
    groups = sum(reward.sizes) // 4  # rollout.n = 4
    # fewer calls than groups: some calls held several groups
    assert len(reward.sizes) < groups and max(reward.sizes) > 4, reward.sizes
    samples = [json.loads(line) for line in (tmp_path / "samples" / "train.jsonl").read_text().splitlines()]
    assert samples
    for sample in samples:  # each sample got its own group's results back, not a neighbour's
        assert sample["reward"] == float(sample["prompt_index"]), sample
    assert learner.trained_steps == [1, 2, 3, 4]


def test_groups_arriving_in_one_turn_of_the_event_loop_are_handed_over_together(tmp_path) -> None:
    """Their `generated` lines in one journal write, the groups to scoring together (one Score call),
    on the loop's next turn; the lines (format unchanged) come before the groups can be scored (issue 44)."""
    import asyncio

    from controller.generation import ScoredGroupInput
    from controller.journal import read_journal
    from rlfleet.data.prompts import Prompt
    from rlfleet.types import Completion

    loop, _ = make_loop(tmp_path, Faults(), staleness=1)
    writes = []
    write = loop.journal._write
    loop.journal._write = lambda data: writes.append(data) or write(data)
    prompt = Prompt(index=0, text="p0", prompt_ids=[1], data_source="digits", ground_truth="1")

    completions = [Completion([1], [-0.1], "stop", 2)]

    async def arrive() -> tuple[tuple[int, int], tuple[int, int]]:
        for seq in range(3):
            loop._hand_to_scoring({"seq": seq, "version": 2, "replica": "h:1"},
                                  ScoredGroupInput(seq, prompt, f"r{seq}", completions, 0.1, "h:1"))
        in_the_turn = (loop._scoring, loop._score_calls)
        await asyncio.sleep(0)  # the loop's next turn
        return in_the_turn, (loop._scoring, loop._score_calls)

    # nothing went out in the turn they arrived in; on the next, the three groups in one Score call
    assert asyncio.run(arrive()) == ((0, 0), (3, 1))
    assert not loop._to_score and len(writes) == 1
    loop.journal.close()
    lines = [e for e in read_journal(tmp_path / "journal" / "prompts.jsonl") if e["event"] == "generated"]
    assert [{k: v for k, v in e.items() if k != "t"} for e in lines] == \
        [{"event": "generated", "seq": seq, "version": 2, "replica": "h:1"} for seq in range(3)]
    assert list(lines[0]) == ["event", "t", "seq", "version", "replica"]


def test_a_journal_that_fails_as_groups_are_handed_over_stops_the_run_with_its_error(tmp_path) -> None:
    """The hand-over runs as an event-loop callback, whose exception asyncio would only log: the error
    goes to the training loop, as one in a generation task does."""
    import asyncio

    from controller.generation import ScoredGroupInput
    from rlfleet.data.prompts import Prompt
    from rlfleet.types import Completion

    loop, _ = make_loop(tmp_path, Faults(), staleness=1)

    def disk_full(data):
        raise OSError(28, "No space left on device")

    loop.journal._write = disk_full
    prompt = Prompt(index=0, text="p0", prompt_ids=[1], data_source="digits", ground_truth="1")

    group = ScoredGroupInput(0, prompt, "r0", [Completion([1], [-0.1], "stop", 2)], 0.1, "h:1")

    async def arrive() -> None:
        loop._hand_to_scoring({"seq": 0, "version": 2, "replica": "h:1"}, group)
        await asyncio.sleep(0)

    asyncio.run(arrive())
    assert isinstance(loop._error, OSError) and "No space" in str(loop._error)
