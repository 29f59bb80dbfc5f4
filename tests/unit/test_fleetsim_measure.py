"""bench/fleetsim/measure.py: the fleet's rate with the learner's pause taken out (numbers by hand)."""
from bench.fleetsim.measure import outside_seconds


def test_outside_seconds_without_a_pause_is_the_whole_span():
    assert outside_seconds(10.0, 70.0, None) == 60.0


def test_outside_seconds_takes_out_the_overlap_with_the_pause():
    # alive 10..70, paused 30..60: 30 s of the 60 are outside the pause
    assert outside_seconds(10.0, 70.0, (30.0, 60.0)) == 30.0
    # a replica that joined in the pause (45..70): 10 s outside it
    assert outside_seconds(45.0, 70.0, (30.0, 60.0)) == 10.0
    # a replica gone before the pause: all of its time is outside it
    assert outside_seconds(0.0, 20.0, (30.0, 60.0)) == 20.0
