"""A watched folder as an event source: one ``dataset.uploaded`` per completed file.

A file counts as complete when its size and modification time have not changed for
``settle`` seconds and no process has it open for writing (Linux read leases tell, without
reading /proc; a writer that pauses longer than ``settle`` is still waited for).
Each announced file is remembered in the state store by path, size, mtime and sha256, so
a restart announces only files that are new or changed since, including those that arrived
while the watcher was down. Layout: ``ROOT/<dataset>/<files...>``; files directly under
ROOT belong to a dataset named after ROOT. Hidden and partial files are ignored, and so are
symbolic links (the folder announces what is in it, never a file elsewhere that a link names)
and names that are not UTF-8 (logged once; they cannot be put into an event). A scan that fails
is logged and retried on the next change; the watcher thread does not end.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

import watchfiles
from cloudevents.http import CloudEvent

from cascade.core.hashing import sha256_file
from cascade.events.bus import EventBus
from cascade.events.envelope import new_event
from cascade.stores import StateStore

PARTIAL = (".tmp", ".part", ".partial", ".crdownload", ".swp", "~")
log = logging.getLogger("cascade.sources.folder")
_F_SETLEASE, _F_RDLCK, _F_UNLCK = 1024, 0, 2  # fcntl(2) on Linux; Python's fcntl module does not name them


def open_for_writing(path: Path) -> bool:
    """Whether some process holds ``path`` open for writing (a read lease is refused then).

    Where leases are not available (another owner's file without CAP_LEASE, a file system
    without them, not Linux) this answers False and the settle time alone decides.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, _F_SETLEASE, _F_RDLCK)
    except OSError as exc:
        return exc.errno in (errno.EAGAIN, errno.EBUSY)
    else:
        fcntl.fcntl(fd, _F_SETLEASE, _F_UNLCK)
        return False
    finally:
        os.close(fd)


class FolderSource:
    """Watches ``root`` and publishes ``dataset.uploaded`` events to ``topic``."""

    def __init__(self, root: str | Path, bus: EventBus, store: StateStore, *, topic: str = "cascade.events",
                 project: str = "default", settle: float = 1.0) -> None:
        self.root = Path(root).resolve()
        self.bus, self.store, self.topic, self.project, self.settle = bus, store, topic, project, settle
        self._seen: dict[Path, tuple[int, int, float]] = {}  # path -> (size, mtime_ns, unchanged since)
        self._stop = threading.Event()
        self._unreadable: set[Path] = set()

    def _wanted(self, path: Path) -> bool:
        rel = path.relative_to(self.root)
        if any(p.startswith(".") for p in rel.parts) or path.name.endswith(PARTIAL):
            return False
        if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(self.root):
            return False  # a link, or a file reached through a linked folder: it lives outside the inbox
        try:
            os.fsencode(path).decode("utf-8")
        except UnicodeDecodeError:
            if path not in self._unreadable:
                self._unreadable.add(path)
                log.warning("ignoring %r: its name is not UTF-8", os.fsencode(path))
            return False
        return True

    def _key(self, path: Path) -> str:
        return f"folder:{self.project}:{self.root}:{path.relative_to(self.root)}"

    def _event(self, path: Path, size: int, digest: str) -> CloudEvent:
        rel = path.relative_to(self.root)
        dataset = rel.parts[0] if len(rel.parts) > 1 else self.root.name
        ident = hashlib.sha256(f"{self.project}\x00{path}\x00{digest}".encode()).hexdigest()[:32]
        data = {"dataset": dataset, "uri": path.as_uri(), "key": str(rel), "size": size, "sha256": digest,
                "origin": "folder"}
        return new_event("dataset.uploaded", data, source=f"/cascade/sources/folder{self.root}", id=f"folder-{ident}",
                         subject=str(rel), partitionkey=dataset, extensions={"project": self.project})

    def scan(self) -> list[CloudEvent]:
        """Publish every file that has settled and was not announced as it is now."""
        now = time.monotonic()
        published = []
        for path in sorted(p for p in self.root.rglob("*") if self._wanted(p)):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            previous = self._seen.get(path)
            if previous is None or previous[:2] != (st.st_size, st.st_mtime_ns):
                self._seen[path] = (st.st_size, st.st_mtime_ns, now)
                if previous is not None or self.settle > 0:
                    continue  # changed just now: wait until it settles
            elif now - previous[2] < self.settle:
                continue
            if open_for_writing(path):
                continue  # a writer that paused: announced once it closes the file
            stamp = json.dumps([st.st_size, st.st_mtime_ns]).encode()
            recorded = self.store.get(self._key(path))
            if recorded is not None and recorded.startswith(stamp):
                continue
            digest = sha256_file(path)
            if recorded is not None and recorded.endswith(digest.encode()):
                self.store.put(self._key(path), stamp + b" " + digest.encode())  # touched, same content
                continue
            event = self._event(path, st.st_size, digest)
            self.bus.publish(self.topic, event)
            self.store.put(self._key(path), stamp + b" " + digest.encode())
            published.append(event)
        self._seen = {p: v for p, v in self._seen.items() if p.exists()}
        return published

    def run(self) -> None:
        """Watch until stop(); scans on every change and while files settle."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._scan_logged()
        for _ in watchfiles.watch(self.root, stop_event=self._stop, rust_timeout=int(max(self.settle, 0.1) * 500),
                                  yield_on_timeout=True, debounce=200):
            self._scan_logged()

    def _scan_logged(self) -> None:
        try:
            self.scan()
        except Exception:  # the bus or store away, a file gone mid-read: the next change scans again
            log.exception("scanning %s failed; retrying on the next change", self.root)

    def stop(self) -> None:
        self._stop.set()
