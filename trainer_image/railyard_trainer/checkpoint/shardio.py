"""One rank's shard of a node tier: serialised once, hashed as it is written, streamed to the
replica peer while it is written, and read back straight into the model's tensors.

**Format.** A shard is a DCP checkpoint directory (``rank-RRRRR/.metadata`` and
``rank-RRRRR/__0_0.distcp``): DCP's save planner still decides what is written and describes it,
so merged metadata, resharding and export work as with DCP's own writer. Only the bytes of tensor
items differ: they are the tensor's memory as it is (contiguous, native byte order), marked with
the storage transform descriptor :data:`RAW`, instead of one ``torch.save`` zip per tensor. That
saves a serialisation pass, the zip's CRC-32 (0.25 s per 350 MB here) and, on load, a temporary
tensor per item: :class:`ShardReader` reads each item straight into the tensor being restored.
Items written by DCP's own writer (checkpoints from before) are read as DCP reads them; a reader
that does not know :data:`RAW` (plain DCP) refuses the file instead of misreading it.

Moving a shard's files between ranks (the replica stream while it is written, the restore's
fetch) is in ``shardstream.py``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import (
    CURRENT_DCP_VERSION,
    FileSystemReader,
    FileSystemWriter,
    _StorageInfo,
)
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from railyard_trainer.checkpoint.digest import (
    DEFAULT_ALGORITHM,
    new_hasher,
)
from railyard_trainer.checkpoint.shardstream import (
    DATA_FILE,
    METADATA_FILE,
    ReplicaReceiver,
    ReplicaSender,
    Spare,
    WrittenFile,
    byte_view,
    cut_pieces,
    fsync_dir,
    open_for_write,
    tensor_bytes,
    write_hashed,
)

#: Storage transform descriptor of a tensor item stored as raw bytes (see the module docstring).
RAW = "railyard-raw-v1"


# ---------------------------------------------------------------------------------- writer


class ShardWriter(FileSystemWriter):
    """DCP storage writer for one rank's self-contained checkpoint (``dcp.save(no_dist=True)``):
    tensor items raw, each piece written once, hashed as written and, with ``replica``, sent to
    the replica peer as it is written. ``receivers`` (the ranks whose replicas land here) are
    advanced between pieces. After ``save``: ``files`` (what was written, with digests)."""

    def __init__(
        self, path: Path, *, algorithm: str = DEFAULT_ALGORITHM, fsync: bool = True,
        replica: ReplicaSender | None = None, receivers: Sequence[ReplicaReceiver] = (),
        spare: Spare | None = None,
    ) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=fsync, thread_count=1)
        self.dir = Path(path)
        self.algorithm = algorithm
        self.fsync = fsync
        self.replica = replica
        self.receivers = list(receivers)
        self.spare = spare
        self.files: list[WrittenFile] = []

    def _poll(self) -> None:
        for r in self.receivers:
            r.poll()

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        results: list[WriteResult] = []
        segments: list[torch.Tensor] = []
        offset = 0
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                blob = cast(io.BytesIO, data).getvalue()
                seg = (
                    torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
                )
                descriptors = None
            else:
                seg = tensor_bytes(cast(torch.Tensor, data))
                descriptors = [RAW]
            n = seg.numel()
            results.append(WriteResult(
                index=item.index, size_in_bytes=n,
                storage_data=_StorageInfo(DATA_FILE, offset, n, transform_descriptors=descriptors),
            ))
            segments.append(seg)
            offset += n
        pieces = cut_pieces(segments)
        if self.replica is not None:
            self.replica.begin(0, [p.numel() for p in pieces])
        hasher = new_hasher(self.algorithm)
        self.dir.mkdir(parents=True, exist_ok=True)
        write_error: BaseException | None = None
        fd = -1
        reused = False
        try:
            fd, reused = open_for_write(self.dir / DATA_FILE, f"{self.dir.name}/{DATA_FILE}", self.spare)
        except OSError as exc:
            write_error = exc
        for p in pieces:
            # Sent first: gloo's thread copies it to the socket while this one writes it.
            if self.replica is not None:
                self.replica.piece(p)
            if write_error is None:
                try:
                    write_hashed(fd, byte_view(p), hasher)
                except OSError as exc:  # keep streaming: the peer's copy may still be good
                    write_error = exc
            else:
                hasher.update(byte_view(p))
            self._poll()
        digest = hasher.hexdigest()
        if self.replica is not None:
            self.replica.end(digest)
        if fd >= 0:
            try:
                if write_error is None and reused:
                    os.ftruncate(fd, offset)
                if write_error is None and self.fsync:
                    os.fsync(fd)
            except OSError as exc:
                write_error = exc
            finally:
                os.close(fd)
        if write_error is not None:
            raise write_error
        self.files.append(WrittenFile(f"{self.dir.name}/{DATA_FILE}", offset, digest, self.algorithm))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {wr.index: wr.storage_data for wrs in results for wr in wrs}
        metadata.storage_meta = self.storage_meta()
        blob = pickle.dumps(metadata)
        hasher = new_hasher(self.algorithm)
        hasher.update(blob)
        digest = hasher.hexdigest()
        piece = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        if self.replica is not None:
            self.replica.begin(1, [piece.numel()])
            self.replica.piece(piece)
            self.replica.end(digest)
        tmp = self.dir / f".{METADATA_FILE}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_hashed(fd, memoryview(blob), None)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.dir / METADATA_FILE)
        if self.fsync:
            fsync_dir(self.dir)
        self.files.append(WrittenFile(f"{self.dir.name}/{METADATA_FILE}", len(blob), digest, self.algorithm))
        self._poll()


# ---------------------------------------------------------------------------------- reader


def _read_into(fd: int, offset: int, t: torch.Tensor) -> None:
    view = byte_view(t.reshape(-1).view(torch.uint8))
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise EOFError(f"shard file ends {len(view) - got} bytes early (at offset {offset + got})")
        got += n


class ShardReader(FileSystemReader):
    """DCP storage reader for shards written by :class:`ShardWriter` (raw tensor items read
    straight into the tensor being restored) and by DCP's own writer (read as DCP reads them)."""

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._chunks: dict[tuple[str, tuple[int, ...]], tuple[torch.Size, torch.dtype]] = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                for c in md.chunks:
                    self._chunks[(fqn, tuple(c.offsets))] = (c.sizes, md.properties.dtype)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        raw: dict[str, list[Any]] = {}
        legacy = []
        for req in plan.items:
            info: _StorageInfo = self.storage_data[req.storage_index]
            if req.type != LoadItemType.BYTE_IO and list(info.transform_descriptors or ()) == [RAW]:
                raw.setdefault(info.relative_path, []).append(req)
            else:
                legacy.append(req)
        if legacy:
            super().read_data(dataclasses.replace(plan, items=legacy), planner).wait()
        for rel, reqs in raw.items():
            fd = os.open(Path(self.path) / rel, os.O_RDONLY)
            try:
                for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                    self._read_raw(fd, req, planner)
            finally:
                os.close(fd)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_raw(self, fd: int, req: Any, planner: LoadPlanner) -> None:
        info: _StorageInfo = self.storage_data[req.storage_index]
        idx = req.storage_index
        sizes, dtype = self._chunks[(idx.fqn, tuple(idx.offset or ()))]
        nbytes = sizes.numel() * torch.empty(0, dtype=dtype).element_size()
        if nbytes != info.length:
            raise ValueError(f"{idx.fqn}: {info.length} bytes stored for a {dtype} chunk of {tuple(sizes)}")
        target = planner.resolve_tensor(req).detach()
        whole = all(o == 0 for o in req.storage_offsets) and tuple(req.lengths) == tuple(sizes)
        if whole and target.device.type == "cpu" and target.dtype == dtype and target.is_contiguous():
            _read_into(fd, info.offset, target)
        else:
            tmp = torch.empty(sizes, dtype=dtype)
            _read_into(fd, info.offset, tmp)
            target.copy_(narrow_tensor_by_index(tmp, req.storage_offsets, req.lengths))
        planner.commit_tensor(req, target)


class MergedShardReader(ShardReader):
    """Reads a node tier's step directory through merged per-rank metadata (resharding)."""

    def __init__(self, path: Any, metadata: Metadata) -> None:
        super().__init__(path)
        self._merged = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self._merged
