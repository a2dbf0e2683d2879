"""A node tier's shard files (``checkpoint/shardio.py``, ``shardstream.py``, ``digest.py``): written raw in
one pass with the digest of what was written, read straight back, refused when torn; and the
replica stream to the peer, whose receiver keeps a file only when it arrived intact and is never
left waiting when the sender fails half way.

The stream runs over a fake point-to-point wire (one process, no gloo): it holds each sent
message until its receive is posted, can damage one message, and lets a test check that every
message sent was received (nobody would be left waiting on a real group) and that a receive
without a matching send is an error (a real receiver would hang).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter  # noqa: E402

from railyard.protocol.manifest import ShardInfo  # noqa: E402
from railyard_trainer.checkpoint import shardstream  # noqa: E402
from railyard_trainer.checkpoint.digest import (  # noqa: E402
    DEFAULT_ALGORITHM,
    SHA256,
    UnknownAlgorithm,
    digest_bytes,
    file_digest,
    new_hasher,
)
from railyard_trainer.checkpoint.shardio import ShardReader, ShardWriter  # noqa: E402
from railyard_trainer.checkpoint.shardstream import (  # noqa: E402
    DATA_FILE,
    METADATA_FILE,
    SHARD_FILES,
    ReplicaReceiver,
    ReplicaSender,
    cut_pieces,
    receive_files,
    recv_ring,
    send_files,
)


class _Done:
    def wait(self) -> None:
        pass

    def is_completed(self) -> bool:
        return True


class _Recv:
    def __init__(self, wire: FakeWire, t: Any, tag: int) -> None:
        self.wire, self.t, self.tag, self.done = wire, t, tag, False

    def is_completed(self) -> bool:
        return self.done or self.tag in self.wire.box

    def wait(self) -> None:
        if self.done:
            return
        if self.tag not in self.wire.box:
            raise RuntimeError(f"receive of tag {self.tag} has no matching send: a real receiver would hang")
        self.t.copy_(self.wire.box.pop(self.tag).reshape(self.t.shape))
        self.done = True
        self.wire.posted -= 1


class FakeWire:
    """Stands in for ``torch.distributed`` in shardstream: one sender, one receiver, messages by tag."""

    def __init__(self, damage_tag: int | None = None) -> None:
        self.box: dict[int, Any] = {}
        self.damage_tag = damage_tag
        self.sent = 0
        #: Receives posted and not yet completed, and the most there ever were at once.
        self.posted = 0
        self.most_posted = 0

    def isend(self, t: Any, dst: int, group: Any = None, tag: int = 0) -> _Done:
        assert tag not in self.box, f"tag {tag} sent twice before it was received"
        data = t.detach().clone().reshape(-1)
        if tag == self.damage_tag and data.numel():
            data.view(torch.uint8)[0] ^= 0x10
        self.box[tag] = data
        self.sent += 1
        return _Done()

    def irecv(self, t: Any, src: int, group: Any = None, tag: int = 0) -> _Recv:
        self.posted += 1
        self.most_posted = max(self.most_posted, self.posted)
        return _Recv(self, t, tag)


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> FakeWire:
    w = FakeWire()
    monkeypatch.setattr(shardstream, "dist", w)
    return w


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "big": torch.randn((5 << 20) // 4 + 5, generator=g),  # more than one piece of the stream
        "small": torch.arange(10, dtype=torch.int64),
        "half": torch.randn(7, 3, generator=g).to(torch.bfloat16),
        "step": 12,
    }


def _empty_like(state: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state.items()}


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


# ----------------------------------------------------------------------- digests


def test_digest_names_its_algorithm_and_refuses_unknown_ones(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    (tmp_path / "f").write_bytes(data)
    for algorithm in {SHA256, DEFAULT_ALGORITHM}:
        h = new_hasher(algorithm)
        h.update(data[:3000])
        h.update(memoryview(data)[3000:])
        assert h.hexdigest() == digest_bytes(data, algorithm)  # incremental == one shot
        assert file_digest(tmp_path / "f", algorithm) == (len(data), digest_bytes(data, algorithm))
        assert digest_bytes(data[:-1] + bytes([data[-1] ^ 1]), algorithm) != digest_bytes(data, algorithm)
    with pytest.raises(UnknownAlgorithm, match="md5"):
        new_hasher("md5")
    assert file_digest(tmp_path / "f", "md5") is None  # a shard this trainer cannot verify is not verified
    assert file_digest(tmp_path / "missing", SHA256) is None


def test_cut_pieces_covers_every_byte_in_order_within_the_chunk() -> None:
    segs = [torch.arange(n, dtype=torch.int64).view(torch.uint8) for n in (3, 0, 70_000, 5, 1)]
    pieces = cut_pieces(segs, chunk=100_000)
    assert all(0 < p.numel() <= 100_000 for p in pieces)
    assert torch.equal(torch.cat(pieces), torch.cat(segs))
    assert len(pieces) == len(cut_pieces(segs, chunk=100_000))
    assert len(pieces) > 1  # the large one was cut, the small ones coalesced around it


# ----------------------------------------------------------------------- files


def test_a_shard_is_written_with_the_digest_of_its_bytes_and_read_back_exactly(tmp_path: Path) -> None:
    state = _state()
    writer = ShardWriter(tmp_path / "rank-00000")
    dcp.save(state, storage_writer=writer, no_dist=True)
    assert sorted(os.path.basename(f.rel) for f in writer.files) == sorted(SHARD_FILES)
    for f in writer.files:
        assert f.algorithm == DEFAULT_ALGORITHM
        assert file_digest(tmp_path / f.rel, f.algorithm) == (f.size, f.digest)
    # Tensors are stored as their bytes: the data file is exactly the tensors, nothing else.
    tensor_bytes = sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    assert tensor_bytes <= (tmp_path / "rank-00000" / DATA_FILE).stat().st_size < tensor_bytes + 4096
    back = _empty_like(state)
    dcp.load(back, storage_reader=ShardReader(tmp_path / "rank-00000"), no_dist=True)
    _assert_same(back, state)


def test_checkpoints_written_by_dcps_own_writer_still_load(tmp_path: Path) -> None:
    state = _state()
    dcp.save(state, storage_writer=FileSystemWriter(tmp_path / "old"), no_dist=True)
    back = _empty_like(state)
    dcp.load(back, storage_reader=ShardReader(tmp_path / "old"), no_dist=True)
    _assert_same(back, state)


def test_plain_dcp_refuses_a_raw_shard_rather_than_misreading_it(tmp_path: Path) -> None:
    state = _state()
    dcp.save(state, storage_writer=ShardWriter(tmp_path / "raw"), no_dist=True)
    with pytest.raises(CheckpointException, match="railyard-raw-v1"):
        dcp.load(_empty_like(state), storage_reader=FileSystemReader(tmp_path / "raw"), no_dist=True)


def test_a_torn_shard_fails_its_digest_and_does_not_load(tmp_path: Path) -> None:
    state = {k: v for k, v in _state().items() if isinstance(v, torch.Tensor)}  # raw items only
    writer = ShardWriter(tmp_path / "rank-00000")
    dcp.save(state, storage_writer=writer, no_dist=True)
    data = next(f for f in writer.files if f.rel.endswith(DATA_FILE))
    path = tmp_path / data.rel
    with open(path, "r+b") as f:  # a write cut short: the tail never reached the file
        f.truncate(data.size // 2)
    assert file_digest(path, data.algorithm) != (data.size, data.digest)
    with pytest.raises(CheckpointException, match="bytes early"):
        dcp.load(_empty_like(state), storage_reader=ShardReader(tmp_path / "rank-00000"), no_dist=True)


def _spares(root: Path) -> Any:
    """A ``spare`` callable over the files under ``root`` (a retired step), as TierStorage's."""

    def take(rel: str, dest: Path) -> bool:
        try:
            os.rename(root / rel, dest)
        except FileNotFoundError:
            return False
        return True

    return take


def test_a_shard_written_over_a_recycled_file_is_exactly_the_new_shard(tmp_path: Path) -> None:
    # A retired step's file, longer than the new shard, with other bytes in it.
    old = tmp_path / "retired" / "rank-00000" / DATA_FILE
    old.parent.mkdir(parents=True)
    old.write_bytes(b"\xee" * (8 << 20))
    inode = old.stat().st_ino
    state = _state()
    writer = ShardWriter(tmp_path / "step" / "rank-00000", spare=_spares(tmp_path / "retired"))
    dcp.save(state, storage_writer=writer, no_dist=True)
    data = tmp_path / "step" / "rank-00000" / DATA_FILE
    assert data.stat().st_ino == inode and not old.exists(), "the retired file was not reused"
    for f in writer.files:
        assert file_digest(tmp_path / "step" / f.rel, f.algorithm) == (f.size, f.digest)
    back = _empty_like(state)
    dcp.load(back, storage_reader=ShardReader(tmp_path / "step" / "rank-00000"), no_dist=True)
    _assert_same(back, state)


# ----------------------------------------------------------------------- replica stream


def _stream(tmp_path: Path, wire: FakeWire) -> tuple[ShardWriter, ReplicaSender, ReplicaReceiver]:
    sender = ReplicaSender(group=None, dst=1)  # type: ignore[arg-type]
    receiver = ReplicaReceiver(None, 0, tmp_path / "peer" / "rank-00000", fsync=False)  # type: ignore[arg-type]
    writer = ShardWriter(tmp_path / "own" / "rank-00000", fsync=False, replica=sender, receivers=[receiver])
    return writer, sender, receiver


def test_the_replica_arrives_identical_and_verified(tmp_path: Path, wire: FakeWire) -> None:
    state = _state()
    writer, sender, receiver = _stream(tmp_path, wire)
    dcp.save(state, storage_writer=writer, no_dist=True)
    receiver.finish()
    assert sender.wait() == "" and receiver.problems == [] and wire.box == {}
    assert sorted(f.rel for f in receiver.files) == sorted(f.rel for f in writer.files)
    for f in writer.files:
        assert (tmp_path / "peer" / f.rel).read_bytes() == (tmp_path / "own" / f.rel).read_bytes()
    assert sorted(os.listdir(tmp_path / "peer" / "rank-00000")) == sorted(SHARD_FILES)  # no temp files
    back = _empty_like(state)
    dcp.load(back, storage_reader=ShardReader(tmp_path / "peer" / "rank-00000"), no_dist=True)
    _assert_same(back, state)


def test_a_replica_received_into_a_recycled_file_is_exactly_what_was_sent(tmp_path: Path, wire: FakeWire) -> None:
    old = tmp_path / "retired" / "rank-00000" / DATA_FILE
    old.parent.mkdir(parents=True)
    old.write_bytes(b"\xee" * (9 << 20))
    inode = old.stat().st_ino
    sender = ReplicaSender(group=None, dst=1)  # type: ignore[arg-type]
    receiver = ReplicaReceiver(  # type: ignore[arg-type]
        None, 0, tmp_path / "peer" / "rank-00000", fsync=False, spare=_spares(tmp_path / "retired"),
    )
    writer = ShardWriter(tmp_path / "own" / "rank-00000", fsync=False, replica=sender, receivers=[receiver])
    dcp.save(_state(), storage_writer=writer, no_dist=True)
    receiver.finish()
    assert sender.wait() == "" and receiver.problems == []
    got = tmp_path / "peer" / "rank-00000" / DATA_FILE
    assert got.stat().st_ino == inode, "the retired file was not reused"
    assert got.read_bytes() == (tmp_path / "own" / "rank-00000" / DATA_FILE).read_bytes()


def test_a_replica_damaged_in_transit_is_not_kept(tmp_path: Path, wire: FakeWire) -> None:
    wire.damage_tag = shardstream._tag(0, 3)  # a piece of the data file
    writer, sender, receiver = _stream(tmp_path, wire)
    dcp.save(_state(), storage_writer=writer, no_dist=True)
    receiver.finish()
    assert sender.wait() == "" and wire.box == {}
    assert any("arrived corrupt" in p for p in receiver.problems)
    assert [os.path.basename(f.rel) for f in receiver.files] == [METADATA_FILE]
    assert sorted(os.listdir(tmp_path / "peer" / "rank-00000")) == [METADATA_FILE]


def test_a_sender_that_stops_half_way_leaves_nobody_waiting_and_nothing_kept(tmp_path: Path, wire: FakeWire) -> None:
    sender = ReplicaSender(group=None, dst=1)  # type: ignore[arg-type]
    receiver = ReplicaReceiver(None, 0, tmp_path / "rank-00000", fsync=False)  # type: ignore[arg-type]
    sender.begin(0, [1000, 1000, 500])
    sender.piece(torch.ones(1000, dtype=torch.uint8))
    receiver.poll()
    sender.seal(len(SHARD_FILES))  # the write failed: the rest is owed, the metadata never comes
    receiver.finish()
    assert sender.wait() == "" and wire.box == {}
    assert receiver.files == [] and len(receiver.problems) == 2
    assert os.listdir(tmp_path / "rank-00000") == []


def test_a_receiver_that_cannot_keep_the_replica_still_drains_it(tmp_path: Path, wire: FakeWire) -> None:
    (tmp_path / "peer").write_text("a file where the directory should be")
    writer, sender, _ = _stream(tmp_path, wire)
    receiver = writer.receivers[0]
    dcp.save(_state(), storage_writer=writer, no_dist=True)
    receiver.finish()
    assert sender.wait() == "" and wire.box == {}
    assert receiver.files == [] and len(receiver.problems) == 2
    assert all("cannot keep" in p for p in receiver.problems)


def _long_state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {"long": torch.randn((5 * shardstream.CHUNK) // 4 + 3, generator=g), "step": 3}


def test_a_stream_longer_than_the_receive_window_arrives_identical_in_bounded_memory(
    tmp_path: Path, wire: FakeWire
) -> None:
    state = _long_state()  # six pieces of the data file, through a ring of two buffers
    sender = ReplicaSender(group=None, dst=1)  # type: ignore[arg-type]
    ring = recv_ring(2)
    receiver = ReplicaReceiver(None, 0, tmp_path / "peer" / "rank-00000", fsync=False, ring=ring)  # type: ignore[arg-type]
    writer = ShardWriter(tmp_path / "own" / "rank-00000", fsync=False, replica=sender, receivers=[receiver])
    dcp.save(state, storage_writer=writer, no_dist=True)
    receiver.finish()
    assert sender.wait() == "" and receiver.problems == [] and wire.box == {}
    # Two pieces, the two file headers, the sizes and the digest: never the whole file at once.
    assert wire.most_posted <= 2 + 4
    assert [t.data_ptr() for t in receiver.ring] == [t.data_ptr() for t in ring]  # reused, not reallocated
    for f in writer.files:
        assert (tmp_path / "peer" / f.rel).read_bytes() == (tmp_path / "own" / f.rel).read_bytes()
    back = _empty_like(state)
    dcp.load(back, storage_reader=ShardReader(tmp_path / "peer" / "rank-00000"), no_dist=True)
    _assert_same(back, state)


def test_pieces_larger_than_the_receive_buffers_still_arrive_intact(tmp_path: Path, wire: FakeWire) -> None:
    sender = ReplicaSender(group=None, dst=1)  # type: ignore[arg-type]
    small_ring = [torch.zeros(16, dtype=torch.uint8) for _ in range(2)]
    receiver = ReplicaReceiver(None, 0, tmp_path / "rank-00000", names=("f",), fsync=False, ring=small_ring)  # type: ignore[arg-type]
    pieces = [torch.arange(n, dtype=torch.int64).view(torch.uint8) % 251 for n in (100, 7, 300)]
    sender.begin(0, [p.numel() for p in pieces])
    h = new_hasher(DEFAULT_ALGORITHM)
    for p in pieces:
        sender.piece(p)
        h.update(memoryview(p.numpy()))
        receiver.poll()
    sender.end(h.hexdigest())
    receiver.finish()
    assert sender.wait() == "" and receiver.problems == [] and wire.box == {}
    assert (tmp_path / "rank-00000" / "f").read_bytes() == b"".join(bytes(p.tolist()) for p in pieces)


def test_a_receiver_interrupted_half_way_still_receives_what_it_was_promised(
    tmp_path: Path, wire: FakeWire, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = ReplicaSender(group=None, dst=1)  # type: ignore[arg-type]
    receiver = ReplicaReceiver(None, 0, tmp_path / "rank-00000", names=("f",), fsync=False, ring=recv_ring(1))  # type: ignore[arg-type]
    sender.begin(0, [10, 10, 10])
    for _ in range(3):
        sender.piece(torch.ones(10, dtype=torch.uint8))
    sender.end(None)

    def broken(*args: Any) -> None:
        raise RuntimeError("disk controller on fire")

    monkeypatch.setattr(shardstream, "write_hashed", broken)
    with pytest.raises(RuntimeError, match="on fire"):
        receiver.finish()
    assert sender.wait() == "" and wire.box == {}  # every piece received: the sender is not left waiting
    assert receiver.files == [] and receiver.problems
    assert os.listdir(tmp_path / "rank-00000") == []


def test_fetched_files_are_kept_only_when_they_match_the_manifest(tmp_path: Path, wire: FakeWire) -> None:
    src = tmp_path / "holder"
    (src / "rank-00001").mkdir(parents=True)
    good, bad = os.urandom(5 << 20), os.urandom(1000)
    (src / "rank-00001" / "a").write_bytes(good)
    (src / "rank-00001" / "b").write_bytes(bad)
    shards = [
        ShardInfo("rank-00001/a", len(good), digest_bytes(good, DEFAULT_ALGORITHM), 1, DEFAULT_ALGORITHM),
        # b's bytes changed on the holder after the manifest was written
        ShardInfo("rank-00001/b", len(bad), digest_bytes(bad[::-1], SHA256), 1, SHA256),
    ]
    assert send_files(None, 1, src, shards) == ""  # type: ignore[arg-type]
    got = receive_files(None, 0, tmp_path / "needer", shards, fsync=False)  # type: ignore[arg-type]
    assert [(s.path, ok) for s, ok in got] == [("rank-00001/a", True), ("rank-00001/b", False)]
    assert wire.box == {}
    assert (tmp_path / "needer" / "rank-00001" / "a").read_bytes() == good
    assert sorted(os.listdir(tmp_path / "needer" / "rank-00001")) == ["a"]
