"""A step's Train request from its groups' parts made when each was scored (issue 44): the bytes must be
those train_batch_to_proto serializes for the whole batch, and a buffered group's part must be made
before the step takes it (the step only joins parts). Expected values are built the plain way here."""
from __future__ import annotations

import time

import pytest

from controller.groups import ScoredGroup
from controller.sample_builder import SampleBuilder
from controller.train_parts import EncodedTrainBatch, assemble_batch, prepare_for_training
from rlfleet import types as t
from rlfleet.algorithm import AlgorithmConfig
from rlfleet.data.prompts import Prompt
from rlfleet.rpc import convert
from tests.unit.test_loop_recovery import FakeLearner, Faults, make_loop, run_loop

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

DEADLINE_S = 60.0  # generous: a loaded 2-core machine


def _flight(i: int, advantage: float) -> t.TrainSample:
    return t.TrainSample([1, 2, 3], [], [], advantage, 3, reward=advantage / 2,
                         payload=t.PayloadRef("10.0.0.1:7000", "r-1", i, 100 + i))


PARTS = [
    [_flight(0, 0.5), _flight(1, -0.5)],  # the data plane: payload refs, no tokens (sample 0 included)
    [t.TrainSample([6], [10, 11], [-0.25, -0.75], 2.0, 4, reward=1.0, loss_mask=[1, 0]),  # an episode
     t.TrainSample([6, 7], [12], [-1.0], -2.0, 4)],
    [],  # a group whose samples all had empty responses
    [t.TrainSample([4, 5], [9] * 300, [-0.5] * 300, 1.25, 2)],  # inline tokens
]


@pytest.mark.parametrize("step, temperature, expected_version", [(7, 0.7, 6), (1, 1.0, 0), (0, 1.0, -1)])
def test_a_request_joined_from_group_parts_is_byte_for_byte_the_whole_batchs(step, temperature,
                                                                            expected_version):
    batch = t.TrainBatch(step, [s for part in PARTS for s in part], temperature=temperature,
                         expected_version=expected_version)
    wire = convert.train_request_wire(batch, [convert.train_samples_wire(part) for part in PARTS])
    assert wire == convert.train_batch_to_proto(batch).SerializeToString()


def _group(seq: int, scores: list[float], lengths: list[int]) -> ScoredGroup:
    completions = [t.Completion([5] * n, [-0.5] * n, "length" if n >= 8 else "stop", 3 - i % 2)
                   for i, n in enumerate(lengths)]
    return ScoredGroup(seq, Prompt(seq, "p", [1, 2], "src", "gt"), completions,
                       [t.ScoreResult(f"r/{i}", s) for i, s in enumerate(scores)])


def _groups() -> list[ScoredGroup]:
    return [_group(0, [1.0, 0.0], [2, 6]), _group(1, [0.5, 0.5], [8, 3]), _group(2, [1.0, 1.0], [2, 2])]


@pytest.mark.parametrize("algo", [AlgorithmConfig(overlong_buffer_ratio=0.5, overlong_penalty=1.0),
                                  AlgorithmConfig(overlong_buffer_ratio=0.0, dynamic_sampling=True),
                                  AlgorithmConfig(advantage="rloo")])
def test_a_batch_of_prepared_groups_is_the_batch_built_at_the_step(algo):
    builder = SampleBuilder(algo, 8)
    fresh = [g for g in _groups() if builder.keep(g)]
    prepared = _groups()
    for g in prepared:
        prepare_for_training(builder, g)
    kept = [g for g in prepared if builder.keep(g)]
    assert [g.seq for g in kept] == [g.seq for g in fresh]
    assert all(g.prepared is not None and g.prepared.wire is not None for g in kept)
    # what the step did before, all at once: every sample and metric, and the request's bytes
    samples, metrics = SampleBuilder(algo, 8).build(fresh)
    batch, got_metrics = assemble_batch(builder, 5, kept, 1.0, 4)
    assert batch.samples == samples and got_metrics == metrics
    assert convert.train_request_wire(batch, batch.sample_wire) == \
        convert.train_batch_to_proto(t.TrainBatch(5, samples, 1.0, 4)).SerializeToString()


def test_a_group_with_too_few_rewards_is_left_for_the_step():
    g = _group(0, [1.0], [3])
    prepare_for_training(SampleBuilder(AlgorithmConfig(), 8), g)
    assert g.prepared is None


def test_a_buffered_groups_samples_and_request_bytes_are_made_before_its_step_takes_it(tmp_path):
    """Step 1's Train waits until the next step's groups (admitted at max_staleness=1) are buffered:
    each already holds its samples, their request bytes and its records' JSON, and step 2's request is
    made of those very bytes objects."""
    loop, _ = make_loop(tmp_path, Faults(), staleness=1, steps=2)
    seen: dict[int, bytes] = {}
    batches: list[t.TrainBatch] = []
    train = FakeLearner.train

    def train_after_the_next_batch_is_buffered(batch):
        batches.append(batch)
        if batch.step == 1:
            deadline = time.monotonic() + DEADLINE_S
            while True:
                with loop._cond:
                    buffered = [g for _, _, g in loop._buffer]
                if len(buffered) >= loop.B:
                    break
                assert time.monotonic() < deadline, "the next step's groups were never buffered"
                time.sleep(0.01)
            for g in buffered:
                assert g.prepared is not None and g.prepared.wire is not None, g.seq
                assert g.record_pieces is not None, g.seq  # its samples/train.jsonl lines' JSON too
                assert g.prepared.samples == g.train_samples(loop.samples.estimator,
                                                             loop.samples.shaped_rewards(g))
                seen[g.seq] = g.prepared.wire
        return train(loop.learner, batch)

    loop.learner.train = train_after_the_next_batch_is_buffered
    assert run_loop(loop) is None
    assert [b.step for b in batches] == [1, 2]
    second = batches[1]
    assert isinstance(second, EncodedTrainBatch) and len(second.sample_wire) == loop.B
    assert all(any(part is wire for wire in seen.values()) for part in second.sample_wire)
    assert convert.train_request_wire(second, second.sample_wire) == \
        convert.train_batch_to_proto(second).SerializeToString()



def test_a_part_made_by_another_builder_is_made_again():
    """Parts are kept on the group; one made under other settings (shaping, estimator) is not reused."""
    g = _group(0, [1.0, 0.0], [2, 8])
    shaping = SampleBuilder(AlgorithmConfig(overlong_buffer_ratio=0.5, overlong_penalty=1.0), 8)
    plain = SampleBuilder(AlgorithmConfig(overlong_buffer_ratio=0.0), 8)
    assert [s.reward for s in shaping.build([g])[0]] == [1.0, -1.0]  # length 8 of 8: the full penalty
    assert [s.reward for s in plain.build([g])[0]] == [1.0, 0.0]
