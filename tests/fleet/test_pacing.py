"""The shipper's decisions played as sequences, with no socket (`journal.pg.pacing`)."""

from __future__ import annotations

from journal.pg.pacing import Pacing


def test_waits_double_while_failing_and_one_incident_is_said_once() -> None:
    pacing = Pacing(first_s=0.5, max_s=5.0)
    assert [pacing.failed(float(t)) for t in range(6)] == [
        (True, 0.5),
        (False, 1.0),
        (False, 2.0),
        (False, 4.0),
        (False, 5.0),
        (False, 5.0),
    ]
    assert pacing.answered(12.5) == 12.5  # the incident lasted from the first failure
    assert pacing.answered(13.0) is None  # nothing more to say
    assert pacing.failed(20.0) == (True, 0.5)  # a new incident, and the waits start over


def test_a_success_between_failures_resets_the_wait() -> None:
    pacing = Pacing(first_s=1.0, max_s=8.0)
    pacing.failed(0.0)
    pacing.failed(1.0)
    assert pacing.answered(3.0) == 3.0
    assert pacing.failed(4.0) == (True, 1.0)


def test_shutdown_ships_for_the_drain_then_no_more() -> None:
    pacing = Pacing(drain_s=3.0)
    assert not pacing.stopping and not pacing.late(100.0)
    pacing.stop(10.0)
    pacing.stop(11.0)  # a second signal does not extend it
    assert pacing.stopping
    assert not pacing.late(12.9)
    assert pacing.late(13.0)
