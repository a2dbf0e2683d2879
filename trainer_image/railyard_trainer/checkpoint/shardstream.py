"""A shard's files on the move between ranks, and the file writes they share with the writer.

The memory tier's replica stream runs while a shard is written (``shardio.ShardWriter`` hands it
each piece); the restore's fetch sends a lost node's files from the neighbour's replica to the
rank that needs them. Both write and hash as the bytes arrive.

**Copies.** The snapshot (host buffers, reused) is the only copy the save makes in memory; from
it each piece is written to the tier file, hashed while in cache, and sent to the replica peer
(``isend`` from the same memory). The peer receives the pieces into a small ring of reused
buffers (:data:`RECV_WINDOW` pieces in flight), hashes each one as it arrives, appends it to its
file with ``write`` and compares the sender's digest at the end. Receiving straight into the
file's pages (``mmap``) would save that ``write`` but takes a page fault per 4 KiB of fresh tmpfs
memory: here 1.2 s per 352 MB against 0.3 s for writing the same bytes.

**Recycled files.** Both ends may be given ``spare`` (:meth:`TierStorage.take_spare`): a file of
a retired step moved into place and overwritten, then cut to its new length. Writing into pages a
tmpfs file already has is a copy; a new file's pages must first be allocated and zeroed (here
0.08-0.11 s against 0.14-0.25 s per 352 MB), and the old step's pages need not be freed.

**Replica stream** (:class:`ReplicaSender` / :class:`ReplicaReceiver`, point-to-point on the
checkpoint's gloo group; per file ``f`` the tags are ``(f << 15) + k``):
``header int64[3] = [pieces, total bytes, algorithm]`` (``pieces = -1``: no file follows),
``sizes int64[pieces]``, the pieces (each at most :data:`CHUNK` bytes), then ``digest uint8[64]``
(hex ASCII, zero-padded; all zeros: the sender could not vouch for what it sent). A sender
always sends every message it announced and a receiver always receives every announced message
(into its receive ring, discarded, when it cannot keep the file), so neither side is ever left waiting by
the other's local failure; only a dead peer (an error on the group) ends a stream early. Every
posted operation is waited for before a stream returns, so tags are reused safely.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from railyard.protocol.manifest import ShardInfo
from railyard_trainer.checkpoint.digest import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    MAX_HEXDIGEST,
    Hasher,
    new_hasher,
)

#: The two files of a shard, in the order they are streamed.
DATA_FILE = "__0_0.distcp"
METADATA_FILE = ".metadata"
SHARD_FILES = (DATA_FILE, METADATA_FILE)
#: Largest message on the replica stream; large tensors are cut into pieces of this size.
CHUNK = 4 << 20
#: Pieces of a replica stream in flight at once on the receiving side (ring buffers of CHUNK).
RECV_WINDOW = 8
#: Tensors smaller than this are coalesced into one piece (one message instead of many).
_SMALL = 256 << 10
#: Granularity of write-then-hash: small enough that the hash reads what the write just touched
#: from cache.
_SLICE = 1 << 20
_FILE_TAG_SHIFT = 15
_MAX_PIECES = (1 << _FILE_TAG_SHIFT) - 4


def _tag(file_index: int, k: int) -> int:
    return (file_index << _FILE_TAG_SHIFT) + k


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor as a flat uint8 view (a copy only when it is not contiguous)."""
    if isinstance(t, DTensor):
        t = t.to_local()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def byte_view(t: torch.Tensor) -> memoryview:
    return memoryview(t.numpy()).cast("B")


def cut_pieces(segments: Sequence[torch.Tensor], chunk: int = CHUNK) -> list[torch.Tensor]:
    """Flat uint8 segments, in order, as messages of at most ``chunk`` bytes: large ones cut,
    runs of small ones coalesced (the only copy, of small tensors)."""
    pieces: list[torch.Tensor] = []
    run: list[torch.Tensor] = []
    run_bytes = 0

    def flush() -> None:
        nonlocal run, run_bytes
        if run:
            pieces.append(run[0] if len(run) == 1 else torch.cat(run))
        run, run_bytes = [], 0

    for seg in segments:
        n = seg.numel()
        if n == 0:
            continue
        if n < min(_SMALL, chunk):
            if run_bytes + n > chunk:
                flush()
            run.append(seg)
            run_bytes += n
            continue
        flush()
        pieces.extend(seg[i : i + chunk] for i in range(0, n, chunk))
    flush()
    return pieces


@dataclass
class WrittenFile:
    rel: str
    size: int
    digest: str
    algorithm: str


#: Moves a retired step's file (a path inside a step directory) to the given path; False: none.
Spare = Callable[[str, Path], bool]


def open_for_write(path: Path, rel: str, spare: Spare | None) -> tuple[int, bool]:
    """A file descriptor to write ``path`` from its start, and whether it is a recycled file
    (then its old contents past what is written must be cut with ``os.ftruncate``)."""
    reused = spare is not None and spare(rel, path)
    flags = os.O_WRONLY | os.O_CREAT | (0 if reused else os.O_TRUNC)
    return os.open(path, flags, 0o644), reused


def write_hashed(fd: int, data: memoryview, hasher: Hasher | None) -> None:
    """Write all of ``data`` at the file's position, hashing each slice right after writing it."""
    for i in range(0, len(data), _SLICE):
        part = data[i : i + _SLICE]
        done = 0
        while done < len(part):
            done += os.write(fd, part[done:])
        if hasher is not None:
            hasher.update(part)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------- stream


class ReplicaSender:
    """The sending end of one rank's replica stream (see the module docstring)."""

    def __init__(self, group: dist.ProcessGroup, dst: int, algorithm: str = DEFAULT_ALGORITHM) -> None:
        self.group, self.dst, self.algorithm = group, dst, algorithm
        self.error = ""
        #: (work, tensor): a tensor stays referenced until its send completed.
        self._works: list[tuple[Any, torch.Tensor]] = []
        self._file = -1
        self._k = 0
        self._sizes: list[int] = []
        self._sent = 0
        self._files_done: set[int] = set()

    def _isend(self, t: torch.Tensor) -> None:
        tag = _tag(self._file, self._k)
        self._k += 1
        if self.error:
            return
        try:
            self._works.append((dist.isend(t, dst=self.dst, group=self.group, tag=tag), t))
        except Exception as exc:  # the peer or the group is gone: stop sending, report it
            self.error = f"replica send to rank {self.dst}: {exc!r}"

    def begin(self, file_index: int, sizes: Sequence[int]) -> None:
        if len(sizes) > _MAX_PIECES:
            raise ValueError(f"{len(sizes)} pieces in one file; at most {_MAX_PIECES} (raise CHUNK)")
        self._file, self._k = file_index, 0
        self._sizes, self._sent = list(sizes), 0
        self._isend(torch.tensor([len(sizes), sum(sizes), ALGORITHMS.index(self.algorithm)], dtype=torch.int64))
        if sizes:
            self._isend(torch.tensor(self._sizes, dtype=torch.int64))

    def piece(self, t: torch.Tensor) -> None:
        self._sent += 1
        self._isend(t)

    def end(self, digest: str | None) -> None:
        """The digest of what was sent (None: the sender cannot vouch for it)."""
        while self._sent < len(self._sizes):  # never leave the receiver waiting for a piece
            self.piece(torch.zeros(self._sizes[self._sent], dtype=torch.uint8))
        raw = (digest or "").encode()[:MAX_HEXDIGEST]
        buf = torch.zeros(MAX_HEXDIGEST, dtype=torch.uint8)
        if raw:
            buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        self._isend(buf)
        self._files_done.add(self._file)

    def absent(self, file_index: int) -> None:
        """Announce that file ``file_index`` will not be sent."""
        self._file, self._k = file_index, 0
        self._isend(torch.tensor([-1, 0, 0], dtype=torch.int64))
        self._files_done.add(file_index)

    def seal(self, n_files: int) -> None:
        """Send whatever is still owed: the rest of a file cut short, and every file not sent
        as absent. Does not wait (the receivers of this rank may still have to be driven)."""
        if self._file >= 0 and self._file not in self._files_done:
            self.end(None)
        for f in range(n_files):
            if f not in self._files_done:
                self.absent(f)

    def wait(self) -> str:
        """Wait for every send; the error, if any."""
        for w, _t in self._works:
            try:
                w.wait()
            except Exception as exc:
                self.error = self.error or f"replica send to rank {self.dst}: {exc!r}"
        self._works = []
        return self.error


@dataclass
class _Incoming:
    name: str
    header: torch.Tensor = field(default_factory=lambda: torch.empty(3, dtype=torch.int64))
    header_work: Any = None
    sizes: list[int] = field(default_factory=list)
    algorithm: str = DEFAULT_ALGORITHM
    fd: int = -1
    tmp: Path | None = None
    reused: bool = False
    #: Receives in flight: piece k is received into ``ring[k % len(ring)]``.
    piece_works: list[Any] = field(default_factory=list)
    posted: int = 0
    hashed: int = 0
    hasher: Hasher | None = None
    digest: torch.Tensor = field(default_factory=lambda: torch.zeros(MAX_HEXDIGEST, dtype=torch.uint8))
    digest_work: Any = None
    state: str = "header"  # header -> pieces -> done
    problem: str = ""
    result: WrittenFile | None = None


class ReplicaReceiver:
    """The receiving end of one source rank's replica stream: its files land in ``directory``
    under temporary names, are checked against the sender's digest and renamed into place.

    :meth:`poll` makes progress without blocking (called between the pieces this rank writes);
    :meth:`finish` completes the stream. ``files`` then holds what arrived intact and
    ``problems`` what did not. ``ring`` (the receive buffers, see :func:`recv_ring`) may be
    passed in and is kept in ``self.ring`` for the next stream, so its pages are faulted once.
    """

    def __init__(
        self, group: dist.ProcessGroup, src: int, directory: Path, *, names: Sequence[str] = SHARD_FILES,
        fsync: bool = True, ring: Sequence[torch.Tensor] | None = None, spare: Spare | None = None,
    ) -> None:
        self.group, self.src, self.directory, self.fsync = group, src, directory, fsync
        self.spare = spare
        self.ring = list(ring) if ring else recv_ring()
        self.files: list[WrittenFile] = []
        self.problems: list[str] = []
        self.error = ""
        self._incoming = [_Incoming(name=n) for n in names]
        for i, inc in enumerate(self._incoming):
            inc.header_work = self._irecv(inc.header, _tag(i, 0))

    def _irecv(self, t: torch.Tensor, tag: int) -> Any:
        if self.error:
            return None
        try:
            return dist.irecv(t, src=self.src, group=self.group, tag=tag)
        except Exception as exc:
            self.error = f"replica receive from rank {self.src}: {exc!r}"
            return None

    def _wait(self, work: Any, block: bool) -> bool:
        """Whether ``work`` is done (waiting for it when ``block``); a failure sets ``error``."""
        if work is None:
            return True
        try:
            if not block and not work.is_completed():
                return False
            work.wait()
        except Exception as exc:
            self.error = self.error or f"replica receive from rank {self.src}: {exc!r}"
        return True

    def _open(self, inc: _Incoming) -> None:
        """Open the file's temporary name (on failure the stream is still drained, not kept)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            inc.tmp = self.directory / f".{inc.name}.rx{os.getpid()}"
            inc.fd, inc.reused = open_for_write(inc.tmp, f"{self.directory.name}/{inc.name}", self.spare)
        except OSError as exc:
            inc.problem = f"replica of {self.directory.name}/{inc.name}: cannot keep it here: {exc!r}"

    def _post_piece(self, i: int, inc: _Incoming) -> None:
        """Post the receive of the next piece of file ``i`` into its ring slot (free by now)."""
        k = inc.posted
        slot = k % len(self.ring)
        size = inc.sizes[k]
        if self.ring[slot].numel() < size:  # a sender with a larger CHUNK
            self.ring[slot] = torch.empty(size, dtype=torch.uint8)
        inc.piece_works.append(self._irecv(self.ring[slot][:size], _tag(i, 2 + k)))
        inc.posted += 1

    def _take_piece(self, inc: _Incoming) -> None:
        """Hash the piece that arrived in its ring slot and append it to the file."""
        k = inc.hashed
        view = byte_view(self.ring[k % len(self.ring)][: inc.sizes[k]])
        if self.error or inc.problem:
            return
        if inc.hasher is not None:
            inc.hasher.update(view)
        if inc.fd >= 0:
            try:
                write_hashed(inc.fd, view, None)
            except OSError as exc:  # keep draining: the sender must finish
                inc.problem = f"replica of {self.directory.name}/{inc.name}: cannot keep it here: {exc!r}"

    def _advance(self, i: int, block: bool) -> bool:
        """One step of file ``i``'s state machine; False when it cannot move without blocking."""
        inc = self._incoming[i]
        if inc.state == "header":
            if not self._wait(inc.header_work, block):
                return False
            n, total, algo = (int(v) for v in inc.header.tolist())
            if self.error or n < 0:
                inc.problem = inc.problem or (self.error or f"rank {self.src} did not send {inc.name}")
                inc.state = "done"
                return True
            inc.algorithm = ALGORITHMS[algo] if 0 <= algo < len(ALGORITHMS) else DEFAULT_ALGORITHM
            if n:
                sizes_t = torch.empty(n, dtype=torch.int64)
                self._wait(self._irecv(sizes_t, _tag(i, 1)), True)
                inc.sizes = [int(v) for v in sizes_t.tolist()]
            if sum(inc.sizes) != total:
                self.error = self.error or f"replica of {inc.name} from rank {self.src}: sizes do not add up"
            if not self.error:
                self._open(inc)
            try:
                inc.hasher = new_hasher(inc.algorithm)
            except ValueError as exc:
                inc.problem = inc.problem or str(exc)
            while inc.posted < min(len(inc.sizes), len(self.ring)):
                self._post_piece(i, inc)
            inc.digest_work = self._irecv(inc.digest, _tag(i, 2 + len(inc.sizes)))
            inc.state = "pieces"
            return True
        if inc.state == "pieces":
            while inc.hashed < len(inc.sizes):
                if not self._wait(inc.piece_works[inc.hashed], block):
                    return False
                inc.piece_works[inc.hashed] = None
                self._take_piece(inc)
                inc.hashed += 1
                if inc.posted < len(inc.sizes):
                    self._post_piece(i, inc)
            if not self._wait(inc.digest_work, block):
                return False
            self._complete(inc)
            inc.state = "done"
            return True
        return False

    def _complete(self, inc: _Incoming) -> None:
        sent = bytes(inc.digest.tolist()).rstrip(b"\0").decode("ascii", "replace")
        inc.piece_works = []
        total = sum(inc.sizes)
        ok = not self.error and not inc.problem and inc.fd >= 0 and inc.hasher is not None and bool(sent)
        if ok and inc.hasher is not None and inc.hasher.hexdigest() != sent:
            inc.problem = f"replica of {self.directory.name}/{inc.name} from rank {self.src} arrived corrupt"
            ok = False
        elif not ok and not inc.problem:
            inc.problem = self.error or (
                f"replica of {self.directory.name}/{inc.name}: rank {self.src} could not send it"
            )
        if inc.fd >= 0:
            try:
                if ok and inc.reused:
                    os.ftruncate(inc.fd, total)
                if ok and self.fsync:
                    os.fsync(inc.fd)
            finally:
                os.close(inc.fd)
                inc.fd = -1
        if inc.tmp is None:
            return
        if ok:
            final = self.directory / inc.name
            os.replace(inc.tmp, final)
            if self.fsync:
                fsync_dir(self.directory)
            inc.result = WrittenFile(f"{self.directory.name}/{inc.name}", total, sent, inc.algorithm)
        else:
            with contextlib.suppress(OSError):
                os.unlink(inc.tmp)

    def poll(self) -> None:
        for i in range(len(self._incoming)):
            while self._advance(i, block=False):
                pass
            if self._incoming[i].state != "done":
                return  # files complete in order

    def finish(self) -> None:
        try:
            for i in range(len(self._incoming)):
                while self._incoming[i].state != "done":
                    self._advance(i, block=True)
        finally:
            for i, inc in enumerate(self._incoming):
                if inc.state != "done":  # an exception above: receive what is owed, keep nothing
                    for w in [inc.header_work, *inc.piece_works, inc.digest_work]:
                        self._wait(w, True)
                    while inc.state == "pieces" and inc.posted < len(inc.sizes):
                        self._post_piece(i, inc)
                        self._wait(inc.piece_works[-1], True)
                    inc.problem = inc.problem or "replica receive interrupted"
                    with contextlib.suppress(Exception):
                        self._complete(inc)
                    inc.state = "done"
            self.files = [inc.result for inc in self._incoming if inc.result is not None]
            self.problems = [inc.problem for inc in self._incoming if inc.problem]


def recv_ring(window: int = RECV_WINDOW) -> list[torch.Tensor]:
    """Receive buffers for a replica stream, their pages faulted now (zeroed) rather than
    during the first save."""
    return [torch.zeros(CHUNK, dtype=torch.uint8) for _ in range(window)]


# ---------------------------------------------------------------------------------- fetch


def _file_pieces(size: int) -> list[tuple[int, int]]:
    return [(i, min(CHUNK, size - i)) for i in range(0, size, CHUNK)]


def send_files(group: dist.ProcessGroup, dst: int, step_dir: Path, shards: Sequence[ShardInfo]) -> str:
    """Send verified shard files (sizes known to both sides from the manifest) to ``dst``,
    straight from the page cache. A file that cannot be read is sent as zeros (its checksum
    fails on arrival) so the receiver is never left waiting. Returns a problem, or ""."""
    works: list[Any] = []
    keep: list[Any] = []
    problem = ""
    try:
        for f, s in enumerate(shards):
            src: torch.Tensor | None = None
            try:
                fd = os.open(step_dir / s.path, os.O_RDONLY)
                try:
                    if os.fstat(fd).st_size != s.bytes:
                        raise OSError(f"{s.path}: size changed since it was verified")
                    if s.bytes:
                        mm = mmap.mmap(fd, s.bytes, access=mmap.ACCESS_COPY)
                        keep.append(mm)
                        src = torch.frombuffer(mm, dtype=torch.uint8)
                finally:
                    os.close(fd)
            except OSError as exc:
                problem = problem or f"reading {s.path}: {exc!r}"
                src = None
            for k, (off, n) in enumerate(_file_pieces(s.bytes)):
                t = src[off : off + n] if src is not None else torch.zeros(n, dtype=torch.uint8)
                keep.append(t)
                works.append(dist.isend(t, dst=dst, group=group, tag=_tag(f, k)))
    finally:
        for w in works:
            try:
                w.wait()
            except Exception as exc:
                problem = problem or f"send to rank {dst}: {exc!r}"
        works.clear()
        keep.clear()
    return problem


@dataclass
class _Landing:
    shard: ShardInfo
    tmp: Path
    fd: int
    mm: mmap.mmap | None = None
    views: list[torch.Tensor] = field(default_factory=list)
    works: list[Any] = field(default_factory=list)
    problem: str = ""

    def release(self) -> None:
        self.views.clear()
        self.works.clear()
        if self.mm is not None:
            with contextlib.suppress(BufferError, ValueError):
                self.mm.close()
            self.mm = None
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def receive_files(
    group: dist.ProcessGroup, src: int, step_dir: Path, shards: Sequence[ShardInfo], *, fsync: bool = True,
) -> list[tuple[ShardInfo, bool]]:
    """Receive what :func:`send_files` sends into ``step_dir`` (temporary names, each checked
    against its manifest digest as it arrives, renamed into place when it matches)."""
    out: list[tuple[ShardInfo, bool]] = []
    landings: list[_Landing] = []
    scratch: torch.Tensor | None = None
    try:
        for f, s in enumerate(shards):
            path = step_dir / s.path
            land = _Landing(s, path.with_name(f".{path.name}.rx{os.getpid()}"), -1)
            landings.append(land)
            dest: torch.Tensor | None = None
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                land.fd = os.open(land.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                if s.bytes:
                    os.ftruncate(land.fd, s.bytes)
                    land.mm = mmap.mmap(land.fd, s.bytes)
                    dest = torch.frombuffer(land.mm, dtype=torch.uint8)
            except OSError as exc:  # still receive it (into scratch): the sender must finish
                land.release()
                land.problem = f"{s.path}: cannot keep it: {exc!r}"
            for k, (off, n) in enumerate(_file_pieces(s.bytes)):
                if dest is not None:
                    view = dest[off : off + n]
                else:
                    if scratch is None:
                        scratch = torch.empty(CHUNK, dtype=torch.uint8)
                    view = scratch[:n]
                land.views.append(view)
                land.works.append(dist.irecv(view, src=src, group=group, tag=_tag(f, k)))
            del dest
        for land in landings:
            hasher = new_hasher(land.shard.algorithm)
            for w, v in zip(land.works, land.views, strict=True):
                w.wait()
                hasher.update(byte_view(v))
            ok = not land.problem and hasher.hexdigest() == land.shard.sha256
            if ok and fsync:
                os.fsync(land.fd)
            land.release()
            if ok:
                final = step_dir / land.shard.path
                os.replace(land.tmp, final)
                if fsync:
                    fsync_dir(final.parent)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(land.tmp)
            out.append((land.shard, ok))
    finally:
        for land in landings[len(out):]:  # an error: wait out what is posted, leave nothing
            for w in land.works:
                with contextlib.suppress(Exception):
                    w.wait()
            land.release()
            with contextlib.suppress(OSError):
                os.unlink(land.tmp)
    return out
