"""The Redis state store: shared state for a platform spread over several machines.

Compare-and-set runs as one Lua script, so it is atomic on the server. Records are JSON
strings with one Redis set per indexed field value; ``namespace`` prefixes every key so
several platforms (or test runs) can share a server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import redis

from cascade.core.errors import StoreUnavailable
from cascade.stores.base import RecordWrite, dump_doc, index_values, load_doc

T = TypeVar("T")

_CAS = """
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '0' then
  if current then return 0 end
elseif current ~= ARGV[2] then return 0 end
if ARGV[3] == '0' then redis.call('DEL', KEYS[1]); return 1 end
if tonumber(ARGV[5]) > 0 then redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
else redis.call('SET', KEYS[1], ARGV[4]) end
return 1
"""

_ADD = """
local out = {}
for i, key in ipairs(KEYS) do
  local ok
  if tonumber(ARGV[2]) > 0 then ok = redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2])
  else ok = redis.call('SET', key, ARGV[1], 'NX') end
  if ok then out[i] = false else out[i] = redis.call('GET', key) end
end
return out
"""

_PUT = """
for i, key in ipairs(KEYS) do
  if tonumber(ARGV[1]) > 0 then redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
  else redis.call('SET', key, ARGV[i + 1]) end
end
return #KEYS
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStore:
    """A StateStore on a Redis server."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, namespace: str = "cascade") -> None:
        self.url = url
        self.ns = namespace
        self._r = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3)
        self._cas = self._r.register_script(_CAS)
        self._add = self._r.register_script(_ADD)
        self._put = self._r.register_script(_PUT)

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis {self.url}: {exc}") from exc

    def _k(self, key: str) -> str:
        return f"{self.ns}:kv:{key}"

    def get(self, key: str) -> bytes | None:
        return self._call(lambda: self._r.get(self._k(key)))  # type: ignore[return-value]

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        px = None if ttl is None else max(1, int(ttl * 1000))
        self._call(lambda: self._r.set(self._k(key), value, px=px))

    def delete(self, key: str) -> bool:
        return bool(self._call(lambda: self._r.delete(self._k(key))))

    def cas(self, key: str, expected: bytes | None, new: bytes | None, *, ttl: float | None = None) -> bool:
        px = 0 if ttl is None else max(1, int(ttl * 1000))
        args = ["0" if expected is None else "1", expected or b"", "0" if new is None else "1", new or b"", px]
        return bool(self._call(lambda: self._cas(keys=[self._k(key)], args=args)))

    def add_many(self, keys: Sequence[str], value: bytes, *, ttl: float | None = None) -> list[bytes | None]:
        if not keys:
            return []
        px = 0 if ttl is None else max(1, int(ttl * 1000))
        found = self._call(lambda: self._add(keys=[self._k(k) for k in keys], args=[value, px]))
        return [None if v is None else bytes(v) for v in found]

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        """One script call, not a pipeline of SETs: redis-py packs and parses one command instead of one per key,
        which is most of the cost of a dispatcher's batch of completions."""
        if len(items) < 2:
            for key, value in items.items():
                self.put(key, value, ttl=ttl)
            return
        px = 0 if ttl is None else max(1, int(ttl * 1000))
        self._call(lambda: self._put(keys=[self._k(k) for k in items], args=[px, *items.values()]))

    def ttl(self, key: str) -> float | None:
        ms = int(self._call(lambda: self._r.pttl(self._k(key))))
        return None if ms < 0 else ms / 1000.0

    def _rec(self, kind: str, id: str) -> str:
        return f"{self.ns}:rec:{kind}:{id}"

    def _idx(self, kind: str, field: str, value: str) -> str:
        return f"{self.ns}:idx:{kind}:{field}:{value}"

    def _fields(self, kind: str, id: str) -> str:
        """The hash of a record's indexed field values (what to take out of the index sets when it changes)."""
        return f"{self.ns}:recidx:{kind}:{id}"

    def _all(self, kind: str) -> str:
        return f"{self.ns}:all:{kind}"

    def put_record(self, kind: str, id: str, doc: Mapping[str, Any], *, index: Sequence[str] = ()) -> None:
        fields_key = self._fields(kind, id)

        def update(pipe: Any) -> None:
            old = pipe.hgetall(fields_key)
            pipe.multi()
            self._unindex(pipe, kind, id, old)
            self._write(pipe, kind, id, doc, index)

        self._call(lambda: self._r.transaction(update, fields_key))

    def commit_records(self, guard: str, expected: bytes | None, new: bytes, puts: Sequence[RecordWrite],
                       deletes: Sequence[tuple[str, str]] = ()) -> bool:
        """WATCH the guard, read the old index entries of every record touched (one pipelined round trip), then
        everything in one MULTI/EXEC; a guard changed meanwhile makes EXEC fail and nothing is written."""
        touched = [*deletes, *((w.kind, w.id) for w in puts)]
        fields = [self._fields(kind, id) for kind, id in touched]

        def attempt() -> bool:
            with self._r.pipeline() as pipe:
                try:
                    pipe.watch(self._k(guard))  # type: ignore[no-untyped-call]
                    if pipe.get(self._k(guard)) != expected:
                        pipe.unwatch()
                        return False
                    reads = self._r.pipeline(transaction=False)
                    for key in fields:
                        reads.hgetall(key)
                    old = dict(zip(touched, reads.execute()))
                    pipe.multi()
                    pipe.set(self._k(guard), new)
                    for kind, id in deletes:
                        self._unindex(pipe, kind, id, old[(kind, id)])
                        pipe.srem(self._all(kind), id)
                        pipe.delete(self._rec(kind, id))
                    for w in puts:
                        self._unindex(pipe, w.kind, w.id, old[(w.kind, w.id)])
                        self._write(pipe, w.kind, w.id, w.doc, w.index)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    return False
        return self._call(attempt)

    def _unindex(self, pipe: Any, kind: str, id: str, old: Mapping[Any, Any]) -> None:
        for f, v in old.items():
            pipe.srem(self._idx(kind, _text(f), _text(v)), id)
        pipe.delete(self._fields(kind, id))

    def _write(self, pipe: Any, kind: str, id: str, doc: Mapping[str, Any], index: Sequence[str]) -> None:
        new = index_values(doc, index)
        for f, v in new.items():
            pipe.sadd(self._idx(kind, f, v), id)
        if new:
            pipe.hset(self._fields(kind, id), mapping=new)
        pipe.set(self._rec(kind, id), dump_doc(doc))
        pipe.sadd(self._all(kind), id)

    def get_record(self, kind: str, id: str) -> dict[str, Any] | None:
        raw = self._call(lambda: self._r.get(self._rec(kind, id)))
        return None if raw is None else load_doc(raw)

    def find_records(self, kind: str, **where: str) -> list[dict[str, Any]]:
        sets = [self._idx(kind, f, str(v)) for f, v in where.items()] or [self._all(kind)]
        ids = sorted(_text(i) for i in self._call(lambda: self._r.sinter(sets)))
        if not ids:
            return []
        raws = self._call(lambda: self._r.mget([self._rec(kind, i) for i in ids]))
        return [load_doc(r) for r in raws if r is not None]

    def delete_record(self, kind: str, id: str) -> bool:
        fields_key = self._fields(kind, id)
        old = self._call(lambda: self._r.hgetall(fields_key))
        pipe = self._r.pipeline()
        for f, v in old.items():
            pipe.srem(self._idx(kind, _text(f), _text(v)), id)
        pipe.delete(fields_key)
        pipe.srem(self._all(kind), id)
        pipe.delete(self._rec(kind, id))
        return bool(self._call(pipe.execute)[-1])

    def ping(self) -> None:
        self._call(self._r.ping)

    def close(self) -> None:
        self._r.close()
