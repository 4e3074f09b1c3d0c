"""The webhook delivery log: per project, bounded by how many deliveries it holds, not by age."""

from __future__ import annotations

from pathlib import Path

from cascade.events.dedup import DeliveryLog
from cascade.events.envelope import new_event
from cascade.stores.sqlite import SqliteStore

UPLOAD = {"dataset": "cats", "uri": "s3://cats/a", "size": 1, "origin": "minio"}


def delivery(n: int, project: str = "alpha") -> object:
    return new_event("dataset.uploaded", UPLOAD, source="/s3/cats", id=f"s3-{n}", extensions={"project": project})


def test_a_delivery_is_remembered_until_capacity_newer_ones_and_per_project(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    log = DeliveryLog(store, capacity=3)
    first = [delivery(n) for n in range(3)]
    assert log.fresh(first + first) == first, "a batch that repeats itself is one delivery each"
    log.remember(first)
    assert log.fresh(first) == []
    assert log.fresh([delivery(0, "beta")]) != [], "another project's delivery with the same id is its own"
    log.remember([delivery(3)])  # the fourth pushes the oldest out of the ring
    assert [e["id"] for e in log.fresh(first)] == ["s3-0"]
    assert log.fresh([delivery(1), delivery(2), delivery(3)]) == []
    assert store.ttl("delivered:alpha:/s3/cats:s3-1") is None, "no clock lets an old delivery back in"
    store.close()


def test_writers_sharing_a_store_share_one_ring(tmp_path: Path) -> None:
    one, two = SqliteStore(tmp_path / "state.db"), SqliteStore(tmp_path / "state.db")
    first, second = DeliveryLog(one, capacity=2), DeliveryLog(two, capacity=2)
    first.remember([delivery(0)])
    second.remember([delivery(1)])
    assert first.fresh([delivery(0), delivery(1)]) == []
    first.remember([delivery(2)])
    assert [e["id"] for e in second.fresh([delivery(0), delivery(1), delivery(2)])] == ["s3-0"]
    one.close()
    two.close()
