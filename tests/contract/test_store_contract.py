"""The StateStore contract, written once and run against SQLite and real Redis."""

from __future__ import annotations

import threading

from cascade.stores import StateStore
from cascade.stores.base import RecordWrite
from cascade.stores.idempotency import Claim, Idempotency, Liveness
from cascade.stores.redis import RedisStore
from cascade.stores.sqlite import SqliteStore
from tests.helpers.waiting import eventually


def twin(store: StateStore) -> StateStore:
    """A second, independent connection to the same store (another worker's view)."""
    if isinstance(store, SqliteStore):
        return SqliteStore(store.path)
    assert isinstance(store, RedisStore)
    return RedisStore(store.url, namespace=store.ns)


class TestStoreContract:
    def test_put_get_delete(self, store: StateStore) -> None:
        assert store.get("a") is None
        store.put("a", b"1")
        assert store.get("a") == b"1"
        store.put("a", b"2")
        assert store.get("a") == b"2"
        assert store.delete("a") is True
        assert store.delete("a") is False
        assert store.get("a") is None

    def test_keys_expire_after_their_ttl(self, store: StateStore) -> None:
        store.put("short", b"x", ttl=0.3)
        store.put("forever", b"y")
        remaining = store.ttl("short")
        assert remaining is not None and 0 < remaining <= 0.3
        assert store.ttl("forever") is None
        assert store.get("short") == b"x"
        eventually(lambda: store.get("short") is None, 5, "the key expiring")
        assert store.ttl("short") is None
        assert store.get("forever") == b"y"
        assert store.cas("short", None, b"again"), "an expired key counts as absent"

    def test_compare_and_set(self, store: StateStore) -> None:
        assert store.cas("k", None, b"v1") is True
        assert store.cas("k", None, b"v2") is False, "expected absent, but it exists"
        assert store.cas("k", b"wrong", b"v2") is False
        assert store.get("k") == b"v1"
        assert store.cas("k", b"v1", b"v2") is True
        assert store.cas("k", b"v2", None) is True, "None deletes"
        assert store.get("k") is None

    def test_compare_and_set_race_loses_no_update(self, store: StateStore) -> None:
        workers, rounds = 6, 40
        store.put("counter", b"0")

        def bump() -> None:
            mine = twin(store)
            for _ in range(rounds):
                while True:
                    current = mine.get("counter")
                    assert current is not None
                    if mine.cas("counter", current, str(int(current) + 1).encode()):
                        break
            mine.close()

        threads = [threading.Thread(target=bump) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.get("counter") == str(workers * rounds).encode()

    def test_only_one_of_many_racing_claims_wins(self, store: StateStore) -> None:
        winners: list[int] = []
        barrier = threading.Barrier(8)

        def claim(i: int) -> None:
            mine = twin(store)
            barrier.wait()
            if mine.cas("claim", None, str(i).encode(), ttl=30):
                winners.append(i)
            mine.close()

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1
        assert store.get("claim") == str(winners[0]).encode()

    def test_records_are_found_by_indexed_fields(self, store: StateStore) -> None:
        store.put_record("job", "j1", {"id": "j1", "status": "running", "project": "a"}, index=("status", "project"))
        store.put_record("job", "j2", {"id": "j2", "status": "running", "project": "b"}, index=("status", "project"))
        store.put_record("job", "j3", {"id": "j3", "status": "failed", "project": "a"}, index=("status", "project"))
        assert [r["id"] for r in store.find_records("job")] == ["j1", "j2", "j3"]
        assert [r["id"] for r in store.find_records("job", status="running")] == ["j1", "j2"]
        assert [r["id"] for r in store.find_records("job", status="running", project="a")] == ["j1"]
        store.put_record("job", "j1", {"id": "j1", "status": "succeeded", "project": "a"}, index=("status", "project"))
        assert [r["id"] for r in store.find_records("job", status="running")] == ["j2"], "old index entry gone"
        assert store.get_record("job", "j1") == {"id": "j1", "status": "succeeded", "project": "a"}
        assert store.delete_record("job", "j2") is True
        assert store.get_record("job", "j2") is None
        assert store.find_records("job", project="b") == []
        assert store.find_records("model") == []

    def test_idempotency_claims(self, store: StateStore) -> None:
        idem = Idempotency(store, "trigger-a", claim_ttl=0.3)
        other = Idempotency(twin(store), "trigger-a", claim_ttl=0.3)
        assert idem.claim("/src", "e1") is Claim.ACQUIRED
        assert other.claim("/src", "e1") is Claim.BUSY
        # the first claimant "crashed": its claim expires, and the other takes it
        eventually(lambda: other.claim("/src", "e1") is Claim.ACQUIRED, 5, "the claim expiring")
        other.complete("/src", "e1")
        assert idem.claim("/src", "e1") is Claim.DONE
        assert Idempotency(store, "trigger-b").claim("/src", "e1") is Claim.ACQUIRED, "scopes are separate"
        assert idem.claim("/src", "e2") is Claim.ACQUIRED
        idem.release("/src", "e2")
        assert other.claim("/src", "e2") is Claim.ACQUIRED, "a released claim can be taken again"

    def test_add_many_sets_only_absent_keys_and_says_what_was_there(self, store: StateStore) -> None:
        store.put("a", b"old")
        assert store.add_many(["a", "b", "c"], b"mine", ttl=0.3) == [b"old", None, None]
        assert twin(store).add_many(["b", "d"], b"theirs") == [b"mine", None], "one connection's add is another's"
        assert store.get("a") == b"old" and store.get("b") == b"mine"
        eventually(lambda: store.get("b") is None, 5, "keys added with a ttl expiring")
        assert store.get("a") == b"old" and store.get("d") == b"theirs", "no ttl: kept"
        assert store.add_many([], b"x") == []
        store.put_many({"p": b"1", "q": b"2"}, ttl=0.3)
        assert (store.get("p"), store.get("q")) == (b"1", b"2")
        eventually(lambda: store.get("p") is None and store.get("q") is None, 5, "put_many's ttl")

    def test_batch_claims_and_group_completions(self, store: StateStore) -> None:
        idem = Idempotency(store, "batch")
        other = Idempotency(twin(store), "batch")
        other.complete("/s", "done")
        assert other.claim("/s", "theirs") is Claim.ACQUIRED
        claims = idem.claim_many([("/s", "new"), ("/s", "done"), ("/s", "theirs"), ("/s", "new")])
        assert claims == [Claim.ACQUIRED, Claim.DONE, Claim.BUSY, Claim.BUSY], "a second copy waits for the first"
        ids = [f"e{i}" for i in range(200)]
        threads = [threading.Thread(target=idem.complete, args=("/s", i)) for i in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert other.claim_many([("/s", i) for i in ids]) == [Claim.DONE] * len(ids), "every completion stored"

    def test_commit_records_writes_all_or_nothing_under_its_guard(self, store: StateStore) -> None:
        store.put_record("job", "old", {"id": "old", "project": "a"}, index=("project",))
        store.put_record("job", "moved", {"id": "moved", "project": "a"}, index=("project",))
        puts = [RecordWrite("job", "new", {"id": "new", "project": "b"}, ("project",)),
                RecordWrite("job", "moved", {"id": "moved", "project": "b"}, ("project",))]
        assert store.commit_records("v", b"stale", b"v2", puts, [("job", "old")]) is False
        assert store.get("v") is None and store.get_record("job", "new") is None, "a wrong guard writes nothing"
        assert [r["id"] for r in store.find_records("job", project="a")] == ["moved", "old"]
        assert store.commit_records("v", None, b"v1", puts, [("job", "old")]) is True
        assert store.get("v") == b"v1"
        assert store.get_record("job", "old") is None
        assert [r["id"] for r in store.find_records("job", project="b")] == ["moved", "new"]
        assert store.find_records("job", project="a") == [], "the moved record left its old index entry"
        assert twin(store).commit_records("v", b"v1", b"v2", [], [("job", "new")]) is True
        assert store.commit_records("v", b"v1", b"v3", puts) is False, "another writer moved the guard on"
        assert [r["id"] for r in store.find_records("job")] == ["moved"]

    def test_claims_of_a_dead_owner_are_taken_over_at_once(self, store: StateStore) -> None:
        dead = Liveness(store, ttl=0.3)
        alive = Liveness(twin(store), ttl=30)
        first = Idempotency(store, "t", claim_ttl=3600, liveness=dead)
        second = Idempotency(twin(store), "t", claim_ttl=3600, liveness=alive)
        assert first.claim("/s", "e") is Claim.ACQUIRED
        assert second.claim("/s", "e") is Claim.BUSY, "its owner is still beating"
        # the owner crashed: no more beats, but the claim has an hour to live
        eventually(lambda: second.claim("/s", "e") is Claim.ACQUIRED, 5, "the dead owner's claim taken over")
        assert first.claim("/s", "e") is Claim.BUSY, "now the live owner holds it"
        second.complete("/s", "e")
        assert first.claim("/s", "e") is Claim.DONE
