"""The scheduler's ledger on both state stores: bookings hold, every end gives them back, the queue admits in
priority-then-submission order, and a second launcher process (or a restarted one) sees the same bookings."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

import pytest

from cascade.core.errors import RetryableError, StoreUnavailable
from cascade.scheduling import ledger as ledger_module
from cascade.scheduling.accelerators import parse
from cascade.scheduling.ledger import Ledger, Waiting
from cascade.scheduling.placement import Inventory, Job, NoFit, Placement
from cascade.stores import StateStore
from tests.conftest import make_store
from tests.helpers.waiting import eventually

INVENTORY = {"flavors": [{"name": "a100", "vendor": "nvidia", "model": "A100", "memoryGiB": 80,
                          "nodes": [{"name": "big", "cards": 8, "cpu": 64, "hostMemoryGiB": 512}]}],
             "quotas": {"vision": {"nvidia": 16}, "nlp": {"nvidia": 4}}}


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> StateStore:
    return make_store(store_kind, tmp_path)


def ledger(store: StateStore) -> Ledger:
    return Ledger(store, Inventory.from_dict(INVENTORY))


def job(name: str, cards: str = "8", project: str = "vision", **kw: float) -> Job:
    return Job(name, parse(cards), 1, "pytorch", project, cpu=kw.get("cpu", 8), memory_gib=kw.get("memory", 64))


def test_three_eight_card_jobs_on_one_eight_card_node_run_one_at_a_time(store: StateStore) -> None:
    led = ledger(store)
    first = led.book(job("a"))
    assert isinstance(first, Placement) and first.slots[0][1] == list(range(8))
    second, third = led.book(job("b")), led.book(job("c", project="nlp", cards="4"))
    assert isinstance(second, Waiting) and "not enough free cards" in second.reasons["a100"]
    assert isinstance(third, Waiting), "a smaller job waits too while every card is booked"
    assert led.book(job("a")) == first, "a redelivered submission gets its own booking back"
    admitted = led.release("a")
    assert [a.placement.job.id for a in admitted] == ["b"], "b came first; c (4 cards) does not fit beside b"
    assert [a.placement.job.id for a in led.release("b")] == ["c"]
    assert led.usage()["waiting"] == []


def test_priority_first_then_submission_order_and_a_blocked_big_job_does_not_hold_back_a_small_one(
        store: StateStore) -> None:
    led = ledger(store)
    assert isinstance(led.book(job("run", cards="6")), Placement)
    led.book(job("low"))
    led.book(job("high"), priority=5)
    assert isinstance(led.book(job("small", cards="2", project="nlp")), Placement), "fits beside run: not held back"
    led.book(job("tiny", cards="1", project="nlp"))
    assert [w["jobId"] for w in led.usage()["waiting"]] == ["high", "low", "tiny"]
    assert [a.placement.job.id for a in led.release("run")] == ["tiny"], "6 free: the 8-card jobs still wait"
    assert led.release("small") == []
    assert [a.placement.job.id for a in led.release("tiny")] == ["high"], "the higher priority first"
    assert [a.placement.job.id for a in led.release("high")] == ["low"]


def test_quota_cores_and_memory_are_booked_and_what_can_never_fit_is_refused(store: StateStore) -> None:
    led = ledger(store)
    with pytest.raises(NoFit, match="quota exhausted"):
        led.book(job("greedy", project="nlp"))  # 8 cards over nlp's quota of 4: never
    with pytest.raises(NoFit):
        led.book(job("huge", cards="1", cpu=128))
    assert isinstance(led.book(job("n1", cards="4", project="nlp")), Placement)
    waiting = led.book(job("n2", cards="2", project="nlp"))
    assert isinstance(waiting, Waiting) and "quota exhausted" in waiting.reasons["a100"], "4 of 4 cards used"
    hungry = led.book(job("cpu-heavy", cards="1", cpu=60))
    assert isinstance(hungry, Waiting) and "cores" in hungry.reasons["a100"], "8 of 64 cores already booked"
    assert led.usage()["projects"] == {"nlp/nvidia": 4.0}


def test_a_job_cancelled_while_it_waited_is_dropped_not_admitted(store: StateStore) -> None:
    led = ledger(store)
    led.book(job("a"))
    led.book(job("gone"))
    led.book(job("kept"))
    admitted = led.release("a", wanted=lambda w: w.job.id != "gone")
    assert [x.placement.job.id for x in admitted] == ["kept"]
    assert led.usage()["waiting"] == []


def test_bookings_survive_a_restart_and_two_launchers_share_them(store: StateStore) -> None:
    one = ledger(store)
    one.book(job("a", cards="4"))
    two = ledger(store)  # another launcher process, or this one restarted
    assert isinstance(two.book(job("b", cards="4")), Placement)
    assert isinstance(one.book(job("c", cards="4")), Waiting), "one sees two's booking"
    assert [a.placement.job.id for a in two.release("a")] == ["c"], "two sees one's queue"
    assert one.release("b") == [] and two.release("c") == []
    results: list[object] = []
    launchers = [ledger(store) for _ in range(4)]
    threads = [threading.Thread(target=lambda led=led, i=i: results.append(led.book(job(f"race{i}", cards="4"))))
               for i, led in enumerate(launchers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(r).__name__ for r in results) == ["Placement", "Placement", "Waiting", "Waiting"], \
        "four launchers at once: two bookings fill the node, two wait"
    assert ledger(store).usage()["flavors"]["a100"]["booked"] == 8.0


def test_threads_of_one_launcher_share_its_ledger_without_over_booking(store: StateStore) -> None:
    shared = ledger(store)  # a function instance runs several handlers at once, in threads, on one ledger
    results: list[object] = []
    threads = [threading.Thread(target=lambda i=i: results.append(shared.book(job(f"t{i}", cards="4"))))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(r).__name__ for r in results) == ["Placement"] * 2 + ["Waiting"] * 6
    assert shared.matcher.inventory.used == {("vision", "nvidia"): 8.0}, "each booking counted once"
    assert ledger(store).usage()["flavors"]["a100"]["booked"] == 8.0


def test_a_cohort_lends_unused_quota_and_takes_it_back_by_preempting_the_borrowed_work(store: StateStore) -> None:
    led = Ledger(store, Inventory.from_dict({
        "flavors": [{"name": "a100", "vendor": "nvidia", "nodes": [{"name": "n1", "cards": 8}]}],
        "quotas": {"vision": {"nvidia": 4}, "nlp": {"nvidia": 4}, "solo": {"nvidia": 4}},
        "cohorts": {"research": ["vision", "nlp"]}}))
    first, second = led.book(job("nlp-1", "4", "nlp")), led.book(job("nlp-2", "4", "nlp"), payload={"spec": {"x": 1}})
    assert isinstance(first, Placement) and isinstance(second, Placement), "nlp borrows vision's idle quota"
    assert led.usage()["projects"] == {"nlp/nvidia": 8.0} and led.evictions() == []
    refused = led.book(job("nlp-3", "2", "nlp"))
    assert isinstance(refused, Waiting) and "cohort research has 0 unused to lend" in refused.reasons["a100"]
    vision = led.book(job("vision-1", "4", "vision"))
    assert isinstance(vision, Placement), "vision takes its own quota back"
    assert led.evictions() == ["nlp-2"], "the newest borrowed booking, and only as much as needed"
    requeued = {w["jobId"]: w for w in led.usage()["waiting"]}
    assert "preempted" in requeued["nlp-2"]["reasons"] and "vision reclaimed" in requeued["nlp-2"]["reasons"]["preempted"]
    again = ledger_view(store)
    assert again.waiting["nlp-2"].payload == {"spec": {"x": 1}}, "requeued with what it needs to start again"
    assert [a.placement.job.id for a in led.release("vision-1")] == ["nlp-2"], "its turn again before nlp-3"
    with pytest.raises(NoFit, match="quota exhausted"):
        led.book(job("solo-1", "8", "solo"))  # no cohort: never beyond its own 4 cards


def ledger_view(store: StateStore) -> Ledger:
    view = ledger(store)
    view.usage()  # a decision: it reads the shared records
    return view


def test_a_job_whose_launch_failed_goes_back_to_its_place_and_is_admitted_again(store: StateStore) -> None:
    led = ledger(store)
    led.book(job("first", "4"), payload={"spec": {"n": 1}})
    led.book(job("later", "8"))
    led.requeue("first", "the API server did not answer")
    waiting = {w["jobId"]: w for w in led.usage()["waiting"]}
    assert waiting["first"]["reasons"] == {"launch": "the API server did not answer"}
    assert [w["jobId"] for w in led.usage()["waiting"]] == ["first", "later"], "its old place, ahead of later"
    assert [a.placement.job.id for a in led.admit()] == ["first"], "4 cards: later's 8 do not fit beside it"
    assert ledger_view(store).tickets["first"].payload == {"spec": {"n": 1}}


def test_an_admission_pass_after_a_requeue_tries_every_flavor_not_only_the_one_a_release_freed(
        store: StateStore) -> None:
    """Without quotas a release's pass tries only the freed flavor (the others were full at the last pass); a
    requeue frees room with no pass after it, so the next pass must try them all, in the queue's order."""
    two = Inventory.from_dict({"flavors": [
        {"name": f, "vendor": "nvidia", "nodes": [{"name": f"{f}-node", "cards": 1}]} for f in ("first", "second")]})
    led = Ledger(store, two)
    one = [Job(name, parse("1")) for name in ("a", "b", "c")]
    assert [getattr(led.book(j), "flavor").name for j in one[:2]] == ["first", "second"]
    assert isinstance(led.book(one[2]), Waiting)
    assert led.admit() == [], "a pass over every flavor: the next ones may try only what a release frees"
    led.requeue("a", "the API server did not answer")  # "first" is free now, and a waits ahead of c
    admitted = led.release("b")
    assert [(a.placement.job.id, a.placement.flavor.name) for a in admitted] == [("a", "first"), ("c", "second")]
    assert [(a.placement.job.id, a.placement.flavor.name) for a in led.release("c")] == []
    assert getattr(led.book(Job("d", parse("1"))), "flavor").name == "second"
    assert isinstance(led.book(Job("e", parse("1"))), Waiting)
    assert [(a.placement.job.id, a.placement.flavor.name) for a in led.release("a")] == [("e", "first")]


class GatedStore:
    """The store, with its commits counted and the first one held until the test lets it go."""

    def __init__(self, store: StateStore) -> None:
        self.store, self.commits, self.gate, self.inside = store, 0, threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def commit_records(self, *args: Any, **kw: Any) -> bool:
        self.commits += 1
        if self.commits == 1:
            self.inside.set()
            assert self.gate.wait(10), "the test never let the first commit go"
        return bool(self.store.commit_records(*args, **kw))


def test_decisions_taken_while_a_commit_is_under_way_share_the_next_commit(store: StateStore) -> None:
    gated = GatedStore(store)
    led = Ledger(cast(StateStore, gated), Inventory.from_dict(INVENTORY))
    results: dict[str, object] = {}

    def book(name: str, cards: str) -> None:
        results[name] = led.book(job(name, cards))

    first = threading.Thread(target=book, args=("lead", "4"))
    first.start()
    assert gated.inside.wait(10), "the first decision's commit started"
    followers = [threading.Thread(target=book, args=(f"f{i}", "2")) for i in range(3)]
    for t in followers:
        t.start()
    eventually(lambda: len(led._open.writes) == 3, 10, "the three followers deciding while the lead commits")
    assert not results, "nobody answered before their decision was durable"
    gated.gate.set()
    for t in [first, *followers]:
        t.join(10)
    assert gated.commits == 2, "the lead's commit, then one for the three decided meanwhile"
    assert sorted(type(r).__name__ for r in results.values()) == ["Placement", "Placement", "Placement", "Waiting"]
    again = ledger_view(store)
    assert sorted(again.booked) == sorted(n for n, r in results.items() if isinstance(r, Placement))
    assert [w["jobId"] for w in again.usage()["waiting"]] == [n for n, r in results.items() if isinstance(r, Waiting)]


def test_unwaited_decisions_lost_to_another_launcher_are_reported_by_sync_and_taken_again(store: StateStore) -> None:
    one, two = ledger(store), ledger(store)
    assert isinstance(one.book(job("a", "4"), wait=False), Placement), "decided in memory, not yet durable"
    assert isinstance(two.book(job("b", "8")), Placement), "two does not see a: it was never written"
    with pytest.raises(RetryableError, match="decided first"):
        one.sync()
    assert isinstance(one.book(job("a", "4")), Waiting), "taken again on the rebuilt view: b holds the node"
    one.sync()  # nothing lost since
    assert [a.placement.job.id for a in two.release("b")] == ["a"]


def test_the_journal_is_folded_into_a_chunked_snapshot_and_a_restart_reads_both(
        store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_module, "COMPACT", 3)
    monkeypatch.setattr(ledger_module, "FOLD", 1)
    monkeypatch.setattr(ledger_module, "CHUNK", 2)
    big = Inventory.from_dict({"flavors": [{"name": "t4", "vendor": "nvidia", "nodes": [
        {"name": f"n{i}", "cards": 1} for i in range(6)]}]})
    led = Ledger(store, big)
    for i in range(8):
        led.book(Job(f"j{i}", parse("1")))
    led.release("j0")  # j6 takes its card
    for i in range(8, 12):
        led.book(Job(f"j{i}", parse("1")), wait=False)
    led.sync()
    assert len(store.find_records(ledger_module.SNAPSHOT)) >= 3, "several chunks"
    assert store.find_records(ledger_module.ENTRY), "and entries after the snapshot"
    restarted = Ledger(store, big)
    assert restarted.usage() == led.usage()
    assert sorted(restarted.booked) == ["j1", "j2", "j3", "j4", "j5", "j6"]
    assert [a.placement.job.id for a in restarted.release("j1")] == ["j7"]
    assert [a.placement.job.id for a in led.release("j2")] == ["j8"], "led rebuilt: it saw the restarted one's decision"


def test_bookings_in_the_per_record_format_of_earlier_releases_are_read_and_folded_in(store: StateStore) -> None:
    old = ledger(store)
    placed = old.book(job("kept", "4"))
    assert isinstance(placed, Placement)
    for kind, id, doc in (("booking", "kept", old._docs["booking", "kept"]),):
        store.put_record(kind, id, doc)  # what an earlier release wrote: a record per booking, no journal
    for e in store.find_records(ledger_module.ENTRY):
        store.delete_record(ledger_module.ENTRY, str(e["id"]))
    for c in store.find_records(ledger_module.SNAPSHOT):
        store.delete_record(ledger_module.SNAPSHOT, str(c["id"]))
    new = ledger(store)
    assert isinstance(new.book(job("next", "4")), Placement)
    assert isinstance(new.book(job("full", "4")), Waiting), "the old booking holds its four cards"
    assert store.find_records("booking") == [], "folded into the snapshot by the first commit"
    assert sorted(ledger_view(store).booked) == ["kept", "next"]


class FlakyStore:
    """The store, with its next commit failing as if the store were away."""

    def __init__(self, store: StateStore) -> None:
        self.store, self.down = store, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def commit_records(self, *args: Any, **kw: Any) -> bool:
        if self.down:
            raise StoreUnavailable("the store is away")
        return bool(self.store.commit_records(*args, **kw))


def test_a_commit_the_store_refused_loses_nothing_durable_and_the_ledger_heals(store: StateStore) -> None:
    flaky = FlakyStore(store)
    led = Ledger(cast(StateStore, flaky), Inventory.from_dict(INVENTORY))
    assert isinstance(led.book(job("kept", "4")), Placement)
    flaky.down = True
    with pytest.raises(StoreUnavailable):
        led.book(job("lost", "4"))
    with pytest.raises(StoreUnavailable):
        led.book(job("unwaited", "4"), wait=False)
        led.sync()
    flaky.down = False
    assert sorted(led.usage()["flavors"]["a100"].items()) == [("booked", 4.0), ("cards", 8)], \
        "the view was rebuilt from the store: only the durable booking holds"
    assert isinstance(led.book(job("lost", "4")), Placement), "taken again once the store is back"
    assert sorted(ledger_view(store).booked) == ["kept", "lost"]
