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


def test_controller_admission_is_the_gap_less_what_the_gate_held():
    from bench.fleetsim.measure import controller_admission

    # one replica: Generate 0..10 (group seq 1 sent at 9), then 12.5..20 (seq 2 sent at 19); seq 2 was
    # dispatched at 12.4 after the gate held it 2.3 s: the controller's own part is 2.5 - 2.3 = 0.2 s
    replicas = [{"busy": [(0.0, 10.0), (12.5, 20.0)], "sent": [(1, 9.0, 9.0, 0), (2, 19.0, 19.0, 1)]}]
    events = [{"event": "dispatched", "seq": 1, "t": 0.0, "held_s": 0.0},
              {"event": "dispatched", "seq": 2, "t": 12.4, "held_s": 2.3}]
    assert [round(x, 6) for x in controller_admission(replicas, events, 0.0, 30.0)] == [0.2]
    # a gap outside the window, or a dispatch without held_s (older code), is left out
    assert controller_admission(replicas, events, 11.0, 30.0) == []
    older = [{k: v for k, v in e.items() if k != "held_s"} for e in events]
    assert controller_admission(replicas, older, 0.0, 30.0) == []


def test_a_slot_freed_while_the_gate_was_closed_is_charged_from_the_hand_out():
    from bench.fleetsim.measure import controller_admission

    # Generate 0..10, then 12.5..20; seq 2's member was seen free 1.3 s late (joined 11.3, held 1.0 s to
    # the hand-out at 12.3). The gate had admitted nothing since 9.0 (held_since), before the slot freed
    # at 10: it held the slot 10 -> 12.3 whatever the controller did, so its own part is 12.5 - 12.3.
    replicas = [{"busy": [(0.0, 10.0), (12.5, 20.0)], "sent": [(1, 9.0, 9.0, 0), (2, 19.0, 19.0, 1)]}]
    events = [{"event": "dispatched", "seq": 1, "t": 0.0, "held_s": 0.0},
              {"event": "dispatched", "seq": 2, "t": 12.4, "held_s": 1.0, "held_since": 9.0,
               "handed_t": 12.3}]
    assert [round(x, 6) for x in controller_admission(replicas, events, 0.0, 30.0)] == [0.2]
    # the gate closed at 11.0, after the slot freed: 10 -> 11 could have been used, the controller's
    events[1]["held_since"] = 11.0
    assert [round(x, 6) for x in controller_admission(replicas, events, 0.0, 30.0)] == [1.2]
