"""The contiguous-acknowledged-prefix rule that keeps commits from skipping unfinished events."""

from __future__ import annotations

from cascade.events.bus.offsets import AckTracker

TP = ("t", 0)


def test_prefix_stops_at_the_first_unacknowledged_offset() -> None:
    tracker = AckTracker()
    for offset in range(10, 15):
        tracker.delivered(TP, offset)
    assert tracker.committable() == {TP: 10}
    tracker.ack(TP, 11)
    tracker.ack(TP, 13)
    assert tracker.committable() == {TP: 10}
    tracker.ack(TP, 10)
    assert tracker.committable() == {TP: 12}
    tracker.ack(TP, 12)
    tracker.ack(TP, 14)
    assert tracker.committable() == {TP: 15}
    assert tracker.in_flight() == 0


def test_gaps_in_offsets_do_not_block_and_commits_are_reported_once() -> None:
    tracker = AckTracker()
    for offset in (3, 7, 9):  # compacted log: offsets are not dense
        tracker.delivered(TP, offset)
        tracker.ack(TP, offset)
    assert tracker.committable() == {TP: 10}
    tracker.mark_committed({TP: 10})
    assert tracker.committable() == {}


def test_duplicate_late_and_foreign_acks_are_ignored() -> None:
    tracker = AckTracker()
    tracker.delivered(TP, 0)
    tracker.delivered(TP, 1)
    tracker.ack(TP, 0)
    tracker.ack(TP, 0)
    tracker.ack(TP, 5)  # never handed out
    tracker.ack(("other", 0), 0)  # partition never assigned
    assert tracker.committable() == {TP: 1}
    tracker.forget([TP])
    tracker.ack(TP, 1)  # revoked meanwhile
    assert tracker.committable() == {}


def test_refetch_after_seek_starts_over() -> None:
    tracker = AckTracker()
    tracker.delivered(TP, 5)
    tracker.delivered(TP, 6)
    tracker.delivered(TP, 5)  # seek back: 5 comes again
    assert tracker.committable() == {TP: 5}
    tracker.ack(TP, 5)
    assert tracker.committable() == {TP: 6}
