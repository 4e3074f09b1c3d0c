"""The release feed's rules on a real SQLite store: who sees an entry, how a staged rollout
opens its waves and halts, credentials, and the byte ranges of artifact downloads."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.core.errors import InvalidInput
from cascade.events.edge import Clusters, Feed, waves
from cascade.events.envelope import new_event
from cascade.events.gateway.edge import byte_range
from cascade.events.gateway.errors import RangeNotSatisfiable
from cascade.stores.sqlite import SqliteStore

SHA = "a" * 64


def released(version: str, **extra: object) -> object:
    return new_event("model.released", {"model": "m", "version": version, "artifactUri": "file:///a/m.pt",
                                        "sha256": SHA, "format": "torchscript", **extra},
                     source="/t", partitionkey="m", extensions={"project": "team"})


def outcome(kind: str, cluster: str, version: str = "1") -> object:
    data = {"model": "m", "version": version, "target": "edge", "cluster": cluster}
    return new_event(kind, {**data, "reason": "smoke test answered 400"} if kind == "model.deploy_failed" else data,
                     source=f"/cascade/edge/{cluster}")


@pytest.fixture
def feed(tmp_path: Path) -> Feed:
    f = Feed(SqliteStore(tmp_path / "state.db"))
    for name, region in (("a", "eu"), ("b", "eu"), ("c", "eu"), ("d", "eu"), ("e", "eu"), ("u", "us")):
        f.clusters.register(name, {"region": region})
    return f


def seen_by(feed: Feed, name: str) -> list[str]:
    labels = {"region": "us" if name == "u" else "eu"}
    return [e["event"]["data"]["version"] for e in feed.for_cluster(name, labels, 0)[0]]


def test_waves_from_lists_and_percentages() -> None:
    assert waves(None, ["a", "b"]) is None
    assert waves({"waves": [["b"], ["a", "x"]]}, ["a", "b", "c"]) == [["b"], ["a"], ["c"]]
    assert waves({"percent": [20, 100]}, list("edcba")) == [["a"], ["b", "c", "d", "e"]]
    assert waves({"percent": [50]}, list("abcd")) == [["a", "b"], ["c", "d"]]


def test_an_entry_reaches_the_selected_clusters_once(feed: Feed) -> None:
    event = released("1", targets={"matchLabels": {"region": "eu"}})
    feed.ingest(event)
    feed.ingest(event)  # delivered again
    assert seen_by(feed, "a") == ["1"] and seen_by(feed, "u") == []
    assert feed.head() == 1
    assert feed.release("m", "1")["project"] == "team"


def test_a_rollout_opens_each_wave_after_the_last_one_deployed_and_halts_on_a_failure(feed: Feed) -> None:
    feed.ingest(released("1", targets={"matchLabels": {"region": "eu"}}, rollout={"waves": [["a"], ["b", "c"]]}))
    assert [seen_by(feed, n) for n in "abcd"] == [["1"], [], [], []]
    feed.ingest(outcome("model.deployed", "a"))
    assert [seen_by(feed, n) for n in "abcd"] == [["1"], ["1"], ["1"], []]
    feed.ingest(outcome("model.deployed", "a"))  # again: nothing opens twice
    feed.ingest(outcome("model.deployed", "b"))
    assert seen_by(feed, "d") == [], "c has not reported yet"
    feed.ingest(outcome("model.deploy_failed", "c"))
    feed.ingest(outcome("model.deployed", "d"))  # not in the wave: ignored
    rollout = feed.rollouts()[0]
    assert rollout["status"] == "halted" and "c" in rollout["reason"] and rollout["waves"][2] == ["d", "e"]
    assert seen_by(feed, "d") == [] and seen_by(feed, "e") == []


def test_a_rollout_finishes_when_the_last_wave_deployed(feed: Feed) -> None:
    feed.ingest(released("2", rollout={"percent": [50, 100]}))
    first = feed.rollouts()[0]["waves"][0]
    for name in first:
        feed.ingest(outcome("model.deployed", name, "2"))
    second = feed.rollouts()[0]["waves"][1]
    for name in second:
        feed.ingest(outcome("model.deployed", name, "2"))
    assert feed.rollouts()[0]["status"] == "done"
    rows = {r["cluster"]: r for r in feed.fleet()}
    assert rows["a"]["desired"] == {"m": "2"} and rows["a"]["serving"] == {"m": "2"}


def test_credentials_are_per_cluster_and_revocable(feed: Feed) -> None:
    clusters = Clusters(feed.store)
    token = clusters.register("z", {"site": "x"})
    assert clusters.lookup(token) == {"name": "z", "labels": {"site": "x"}, "registered": clusters.all()[-1]["registered"]}
    again = clusters.register("z", {"site": "y"})
    assert clusters.lookup(token) is None and clusters.lookup(again)["labels"] == {"site": "y"}
    clusters.revoke("z")
    assert clusters.lookup(again) is None
    assert clusters.lookup("cas_not-an-edge-credential") is None
    with pytest.raises(InvalidInput, match="cluster name"):
        clusters.register("Bad_Name", {})


def test_byte_ranges() -> None:
    assert byte_range(None, 100) is None
    assert byte_range("bytes=10-", 100) == (10, 99)
    assert byte_range("bytes=10-19", 100) == (10, 19)
    assert byte_range("bytes=-5", 100) == (95, 99)
    assert byte_range("bytes=90-500", 100) == (90, 99)
    with pytest.raises(RangeNotSatisfiable):
        byte_range("bytes=100-", 100)
    for bad in ("bytes=a-b", "items=0-1", "bytes=0-1,4-5", "bytes=5"):
        with pytest.raises(InvalidInput):
            byte_range(bad, 100)


def test_a_long_feed_is_read_in_pages_and_a_rollout_over_nobody_reaches_nobody(tmp_path: Path) -> None:
    feed = Feed(SqliteStore(tmp_path / "state.db"))
    feed.ingest(released("1", rollout={"percent": [100]}))  # no cluster registered yet
    for i in range(2, 8):
        feed.ingest(released(str(i)))
    feed.clusters.register("late", {})
    page, upto = feed.for_cluster("late", {}, 0, limit=3)
    assert upto == 3 and [e["seq"] for e in page] == [2, 3], "the rollout's entry reached no cluster"
    page, upto = feed.for_cluster("late", {}, upto, limit=3)
    assert upto == 6 and [e["seq"] for e in page] == [4, 5, 6]
