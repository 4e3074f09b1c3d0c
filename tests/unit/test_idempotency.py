"""Group completions: every waiter of a failed write learns of it, and the next write works."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from cascade.core.errors import StoreUnavailable
from cascade.stores.idempotency import Claim, Idempotency
from cascade.stores.sqlite import SqliteStore
from tests.helpers.waiting import eventually


class FlakyStore(SqliteStore):
    """Refuses ``put_many`` while ``down`` is set, and lets the test hold a write in flight."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.down = False
        self.gate = threading.Event()
        self.gate.set()
        self.writes: list[int] = []

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        self.writes.append(len(items))
        self.gate.wait(10)
        if self.down:
            raise StoreUnavailable("the store is away")
        super().put_many(items, ttl=ttl)


def test_a_failed_group_write_fails_each_of_its_waiters_and_the_next_one_works(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "s.db")
    idem = Idempotency(store, "t")
    store.down = True
    with pytest.raises(StoreUnavailable):
        idem.complete("/s", "e0")
    store.down = False
    idem.complete("/s", "e0")
    assert idem.claim_many([("/s", "e0")]) == [Claim.DONE]


def test_completions_that_queue_behind_a_write_share_the_next_one(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "s.db")
    idem = Idempotency(store, "t")
    store.gate.clear()  # the first write waits in flight while 20 more completions queue up
    first = threading.Thread(target=idem.complete, args=("/s", "first"))
    first.start()
    eventually(lambda: store.writes == [1], 5, "the first completion's write in flight")
    rest = [threading.Thread(target=idem.complete, args=("/s", f"e{i}")) for i in range(20)]
    for t in rest:
        t.start()
    eventually(lambda: idem._done.qsize() == 20, 5, "20 completions queued behind it")
    store.gate.set()
    for t in [first, *rest]:
        t.join(10)
    assert store.writes == [1, 20], "the 20 queued completions went in one write"
    assert idem.claim_many([("/s", f"e{i}") for i in range(20)]) == [Claim.DONE] * 20


def test_complete_later_calls_back_once_the_write_is_done_or_with_the_error(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "s.db")
    idem = Idempotency(store, "t")
    outcomes: list[BaseException | None] = []
    store.down = True
    idem.complete_later("/s", "e0", outcomes.append)
    eventually(lambda: len(outcomes) == 1, 5, "the refused write's callback")
    assert isinstance(outcomes[0], StoreUnavailable)
    assert idem.claim_many([("/s", "e0")]) == [Claim.ACQUIRED], "nothing was written"
    store.down = False
    idem.complete_later("/s", "e1", outcomes.append)
    eventually(lambda: len(outcomes) == 2, 5, "the written completion's callback")
    assert outcomes[1] is None and idem.claim_many([("/s", "e1")]) == [Claim.DONE]


def test_a_trickle_of_later_completions_shares_one_write_within_the_linger(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "s.db")
    idem = Idempotency(store, "t", linger=1.0)
    outcomes: list[BaseException | None] = []
    for i in range(5):  # one every 20 ms: without the linger, each would wake the writer for a write of its own
        idem.complete_later("/s", f"e{i}", outcomes.append)
        threading.Event().wait(0.02)
    eventually(lambda: len(outcomes) == 5, 10, "the five callbacks")
    assert store.writes == [5] and outcomes == [None] * 5


def test_complete_does_not_wait_for_the_linger(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "s.db")
    idem = Idempotency(store, "t", linger=60.0)
    later: list[BaseException | None] = []
    idem.complete_later("/s", "e0", later.append)  # the writer lingers on this one
    eventually(lambda: idem._done.qsize() == 0, 5, "the writer took the first completion")
    waiter = threading.Thread(target=idem.complete, args=("/s", "e1"))
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive(), "complete() waited for the linger"
    assert store.writes == [2] and later == [None], "what lingered went in the same write"
