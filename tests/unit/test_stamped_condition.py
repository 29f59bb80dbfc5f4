"""controller.generation.StampedCondition: a wait held back by the gate counts up to the notify that let
it through, not up to the waiter's own wake-up (which is the controller's latency)."""
import threading
import time

from controller.generation import StampedCondition


def test_a_wait_ended_by_a_notify_is_held_until_the_notify():
    cond = StampedCondition()
    notified = []

    def notify_later() -> None:
        time.sleep(0.2)
        with cond:
            cond.notify_all()
            notified.append(time.perf_counter())
            time.sleep(0.1)  # the waiter cannot wake before the lock is let go: 0.1 s of its own latency

    with cond:
        began = time.perf_counter()  # before the notifier starts its 0.2 s
        threading.Thread(target=notify_later).start()
        cond.wait(5.0)
        woke = time.perf_counter()
        held = cond.held_since(began)
    # it ends at the notify (stamped before `notified` was taken), not at the wake-up (>= 0.1 s after it)
    assert held >= 0.2 and began + held <= notified[0]
    assert woke - (began + held) >= 0.1


def test_a_wait_that_timed_out_was_held_all_along():
    cond = StampedCondition()
    with cond:
        began = time.perf_counter()
        cond.wait(0.05)
        held = cond.held_since(began)
    assert held >= 0.05
