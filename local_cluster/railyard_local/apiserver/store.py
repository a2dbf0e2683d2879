"""Durable object storage for the embedded API server.

Objects live in memory (dicts keyed by resource, namespace and name, with their JSON bytes
serialised once) and in SQLite (WAL mode) under the state directory. A write is applied to
memory at once, then committed by a single writer task that groups every write pending at that
moment into one transaction (group commit); the caller's future resolves only after the commit
that includes its write, so every acknowledged write survives SIGKILL. Watch events are
published in resourceVersion order after their commit, into a bounded window that watchers can
resume from.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import fcntl
import json
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from railyard_local import jsonexact

from .sharing import ManagedFieldsInterner

JSON = dict[str, Any]
ObjKey = tuple[str, str, str]
"""(resource key such as ``pods`` or ``trainingjobs.railyard.io``, namespace or "", name)."""


#: ``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)`` without the circular-reference
#: check: the same C encoder and the same bytes in a sixth less time (the check records every dict
#: and list it enters in a dict of ids; a stored object is a tree, decoded JSON or built by the
#: server). Made once: ``json.dumps`` with arguments builds an encoder per call.
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False).encode


def dumps(obj: Any) -> bytes:
    """The object's compact JSON as every answer and the store carry it (kube-apiserver's byte for
    byte where the golden replays compare: non-ASCII as UTF-8, key order kept)."""
    return _ENCODE(obj).encode()


#: What a stored object's canonical managedFields stand in for while the rest is encoded: a
#: string no client sends (random per process), replaced by the list's cached JSON afterwards.
_PLACEHOLDER = "\x00managedFields " + secrets.token_hex(16)
_PLACEHOLDER_JSON = _ENCODE(_PLACEHOLDER)


def dumps_stored(obj: JSON, interner: ManagedFieldsInterner) -> bytes:
    """``dumps(obj)`` with ``metadata.managedFields`` written from the interner's cached JSON when it
    is a canonical list (the same bytes: compact JSON of a value does not depend on where it sits).
    An object whose text would hold the placeholder anywhere else is encoded whole."""
    meta = obj.get("metadata")
    if type(meta) is dict:
        managed = meta.get("managedFields")
        text = interner.encoded(managed)
        if text is not None:
            meta["managedFields"] = _PLACEHOLDER
            try:
                out = _ENCODE(obj)
            finally:
                meta["managedFields"] = managed
            if out.count(_PLACEHOLDER_JSON) == 1:
                return out.replace(_PLACEHOLDER_JSON, text).encode()
    return dumps(obj)


@dataclass(slots=True)
class Entry:
    """A stored object and its serialised form. Never mutate ``obj``: copy with ``clone``."""

    obj: JSON
    raw: bytes

    def clone(self) -> JSON:
        result: JSON = jsonexact.loads(self.raw)
        return result


@dataclass(slots=True)
class Event:
    rv: int
    rkey: str
    namespace: str
    type: str  # ADDED, MODIFIED, DELETED
    entry: Entry
    prev: JSON | None
    _line: bytes | None = None

    def line(self) -> bytes:
        if self._line is None:
            self._line = b'{"type":"' + self.type.encode() + b'","object":' + self.entry.raw + b"}\n"
        return self._line


@dataclass(eq=False)
class Watcher:
    """One watch stream's subscription; the store appends matching events to ``queue``."""

    rkey: str
    namespace: str | None
    queue: collections.deque[Event] = field(default_factory=collections.deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    overflowed: bool = False


@dataclass(slots=True)
class _Op:
    key: ObjKey
    rv: int
    entry: Entry | None  # None: delete
    event: Event
    future: asyncio.Future[None]


class Store:
    """In-memory objects backed by SQLite with group commit and a watch event window."""

    def __init__(self, state_dir: Path, *, event_window: int = 20_000,
                 watcher_queue_limit: int = 200_000) -> None:
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # the objects include Secrets
        self._db_path = state_dir / "objects.sqlite"
        self._objects: dict[str, dict[tuple[str, str], Entry]] = {}
        self.by_uid: dict[str, ObjKey] = {}
        self.dependents: dict[str, set[ObjKey]] = {}
        self.rv = 0
        self._events: collections.deque[Event] = collections.deque(maxlen=event_window)
        self.window_start_rv = 0
        """Events with rv > window_start_rv are all in the window."""
        self._watchers: dict[str, set[Watcher]] = {}
        self._watcher_queue_limit = watcher_queue_limit
        self._pending: list[_Op] = []
        self._wake = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sqlite")
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self.listeners: list[Callable[[Event], None]] = []
        """Called synchronously for every committed event (controllers use this)."""
        self._interner = ManagedFieldsInterner()

    # ---- lifecycle -------------------------------------------------------------------------

    def _lock(self) -> None:
        """One server per state dir: two would each trust their own memory and diverge."""
        fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(f"another API server is using the state directory {self.state_dir}; stop it "
                               "first (railyard local down) or choose another --state-dir") from None
        self._lock_fd = fd

    def _open_db(self) -> list[tuple[str, str, str, bytes]]:
        self._lock()
        db = sqlite3.connect(self._db_path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed transaction survives a process kill (not power loss).
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS objects (rkey TEXT NOT NULL, ns TEXT NOT NULL, "
            "name TEXT NOT NULL, rv INTEGER NOT NULL, data BLOB NOT NULL, "
            "PRIMARY KEY (rkey, ns, name)) WITHOUT ROWID"
        )
        db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        row = db.execute("SELECT v FROM meta WHERE k='rv'").fetchone()
        self.rv = int(row[0]) if row else 0
        rows = db.execute("SELECT rkey, ns, name, data FROM objects").fetchall()
        self._db = db
        return [(r[0], r[1], r[2], bytes(r[3])) for r in rows]

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(self._executor, self._open_db)
        for rkey, ns, name, data in rows:
            obj = json.loads(data)
            self._interner.share(obj)
            self._index(rkey, ns, name, Entry(obj, data), None)
        self.window_start_rv = self.rv
        self._writer = asyncio.create_task(self._write_loop(), name="apiserver-sqlite-writer")

    def end_watches(self) -> None:
        """Make every open watch stream finish (server shutdown)."""
        for watchers in self._watchers.values():
            for w in watchers:
                w.overflowed = True
                w.wake.set()

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._writer is not None:
            await self._writer
        self.end_watches()
        loop = asyncio.get_running_loop()
        if self._db is not None:
            db = self._db
            await loop.run_in_executor(self._executor, db.close)
            self._db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        self._executor.shutdown(wait=True)

    # ---- reads -----------------------------------------------------------------------------

    def get(self, rkey: str, namespace: str, name: str) -> Entry | None:
        bucket = self._objects.get(rkey)
        return None if bucket is None else bucket.get((namespace, name))

    def items(self, rkey: str, namespace: str | None = None) -> Iterator[Entry]:
        bucket = self._objects.get(rkey, {})
        if namespace is None:
            yield from list(bucket.values())
        else:
            yield from [e for (ns, _), e in bucket.items() if ns == namespace]

    def keys(self, rkey: str) -> list[tuple[str, str]]:
        return list(self._objects.get(rkey, {}))

    def resource_keys(self) -> list[str]:
        return list(self._objects)

    def count(self, rkey: str) -> int:
        return len(self._objects.get(rkey, {}))

    def get_by_uid(self, uid: str) -> Entry | None:
        key = self.by_uid.get(uid)
        return None if key is None else self.get(*key)

    # ---- writes ----------------------------------------------------------------------------

    def _index(self, rkey: str, ns: str, name: str, entry: Entry | None, old: Entry | None) -> None:
        key = (rkey, ns, name)
        if old is not None:
            meta = old.obj.get("metadata", {})
            self.by_uid.pop(meta.get("uid", ""), None)
            for ref in meta.get("ownerReferences") or []:
                deps = self.dependents.get(ref.get("uid", ""))
                if deps is not None:
                    deps.discard(key)
                    if not deps:
                        del self.dependents[ref.get("uid", "")]
        bucket = self._objects.setdefault(rkey, {})
        if entry is None:
            bucket.pop((ns, name), None)
            return
        bucket[(ns, name)] = entry
        meta = entry.obj.get("metadata", {})
        if meta.get("uid"):
            self.by_uid[meta["uid"]] = key
        for ref in meta.get("ownerReferences") or []:
            if ref.get("uid"):
                self.dependents.setdefault(ref["uid"], set()).add(key)

    def write(self, rkey: str, obj: JSON, *, delete: bool = False) -> tuple[Entry, asyncio.Future[None]]:
        """Store ``obj`` (or remove it when ``delete``) with a fresh resourceVersion.

        Memory is updated before this returns; await the future for durability. The object
        must not be mutated afterwards by the caller.
        """
        meta = obj["metadata"]
        ns = meta.get("namespace", "") or ""
        name = meta["name"]
        old = self.get(rkey, ns, name)
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self._interner.share(obj)
        entry = Entry(obj, dumps_stored(obj, self._interner))
        self._index(rkey, ns, name, None if delete else entry, old)
        etype = "DELETED" if delete else ("ADDED" if old is None else "MODIFIED")
        event = Event(self.rv, rkey, ns, etype, entry, None if old is None else old.obj)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Op((rkey, ns, name), self.rv, None if delete else entry, event, fut))
        self._wake.set()
        return entry, fut

    def _commit(self, ops: list[tuple[ObjKey, int, bytes | None]], rv: int) -> None:
        db = self._db
        assert db is not None
        db.execute("BEGIN")
        try:
            for (rkey, ns, name), orv, data in ops:
                if data is None:
                    db.execute("DELETE FROM objects WHERE rkey=? AND ns=? AND name=?", (rkey, ns, name))
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO objects (rkey, ns, name, rv, data) VALUES (?,?,?,?,?)",
                        (rkey, ns, name, orv, data),
                    )
            db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('rv', ?)", (str(rv),))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if not batch:
                if self._closing:
                    return
                continue
            ops = [(op.key, op.rv, None if op.entry is None else op.entry.raw) for op in batch]
            try:
                await loop.run_in_executor(self._executor, self._commit, ops, batch[-1].rv)
            except Exception as exc:
                for op in batch:
                    if not op.future.done():
                        op.future.set_exception(exc)
                continue
            for op in batch:
                self._publish(op.event)
                if not op.future.done():
                    op.future.set_result(None)

    # ---- watch -----------------------------------------------------------------------------

    def _publish(self, event: Event) -> None:
        if len(self._events) == self._events.maxlen:
            self.window_start_rv = self._events[0].rv
        self._events.append(event)
        for w in self._watchers.get(event.rkey, ()):
            if w.namespace is not None and w.namespace != event.namespace:
                continue
            if len(w.queue) >= self._watcher_queue_limit:
                w.overflowed = True
            else:
                w.queue.append(event)
            w.wake.set()
        for listener in self.listeners:
            listener(event)

    @property
    def committed_rv(self) -> int:
        return self._events[-1].rv if self._events else self.window_start_rv

    def subscribe(self, rkey: str, namespace: str | None, since_rv: int | None) -> Watcher:
        """Subscribe to events of ``rkey``; replay window events with rv > ``since_rv``.

        Raises ``LookupError`` when ``since_rv`` is older than the window.
        """
        w = Watcher(rkey, namespace)
        if since_rv is not None:
            if since_rv < self.window_start_rv:
                raise LookupError(since_rv)
            for ev in self._events:
                if ev.rv > since_rv and ev.rkey == rkey and (namespace is None or ev.namespace == namespace):
                    w.queue.append(ev)
        self._watchers.setdefault(rkey, set()).add(w)
        if w.queue:
            w.wake.set()
        return w

    def unsubscribe(self, w: Watcher) -> None:
        self._watchers.get(w.rkey, set()).discard(w)

    def oldest_rv(self) -> int:
        return self.window_start_rv
