from radixray.router.circuit_breaker import CircuitBreaker


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_opens_after_threshold_half_opens_after_cooldown_and_closes_on_success():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=2, cooldown_s=1.0, clock=clock)
    assert b.closed and not b.record_failure()
    assert b.closed  # one failure is not enough
    assert b.record_failure()  # the second opens it
    assert b.state == "open" and not b.may_probe()
    clock.t = 0.99
    assert b.state == "open"
    clock.t = 1.0
    assert b.state == "half_open" and b.may_probe()
    assert b.record_success() and b.closed


def test_failed_probe_reopens_with_doubled_cooldown_up_to_the_cap():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, cooldown_s=1.0, max_cooldown_s=3.0, clock=clock)
    b.record_failure()
    clock.t = 1.0
    assert b.state == "half_open"
    b.record_failure()  # probe failed: open for 2 s now
    clock.t = 2.9
    assert b.state == "open"
    clock.t = 3.0
    assert b.state == "half_open"
    b.record_failure()  # 4 s capped at 3 s
    clock.t = 5.9
    assert b.state == "open"
    clock.t = 6.0
    assert b.state == "half_open"
    assert b.opened_count == 1


def test_success_resets_the_failure_count_and_trip_opens_at_once():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=2, clock=clock)
    b.record_failure()
    b.record_success()
    assert not b.record_failure() and b.closed
    assert b.trip() and b.state == "open"
    assert not b.trip()  # already open
