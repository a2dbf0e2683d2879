"""Tier storage: where a tier's bytes live. The manager decides; a backend only moves bytes.

All three tiers are directories (``memory``: a tmpfs host path such as /dev/shm/railyard on the
node, ``local``: node-local disk, ``shared``: a shared volume), so one class serves them; the
Protocol is the seam for other stores and for fault injection in tests. torch-free.

Layout: ``<root>/<job>/step-<NNNNNNNN>/`` holds the shard files and, once committed,
``manifest.json``. Writes of small files are atomic (temp name, fsync, rename). The shard files
of node tiers are written by ``shardio`` directly under :meth:`TierStorage.step_dir` (one pass,
hashed as written, streamed to the replica peer).

**Recycling (node tiers).** A node tier that retires a step keeps its files in ``<job>/.spare/``
and the next save moves them into place and overwrites them (:meth:`DirectoryStorage.take_spare`):
on tmpfs, writing into pages a file already has costs about half of writing a new file (whose
pages the kernel must allocate and zero), and nothing is freed. The tier then holds ``keep + 1``
steps between saves, which is what it holds during every save anyway (``keep`` committed steps
and the one being written), so its peak does not change.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Protocol

from railyard.protocol.manifest import MANIFEST_NAME, Manifest, ManifestError, step_dirname
from railyard_trainer.checkpoint.digest import SHA256, file_digest


class TierStorage(Protocol):
    name: str
    #: Whether written files are fsynced before they count (off only for throwaway tiers).
    fsync: bool

    def step_dir(self, step: int) -> Path:
        """Directory of one step; DCP writers and readers use it directly."""

    def list_steps(self) -> list[int]:
        """Every step directory, committed or not, ascending."""

    def read_manifest(self, step: int) -> Manifest | None:
        """The committed manifest, or None (no manifest, unreadable or malformed)."""

    def commit(self, step: int, manifest: Manifest) -> None:
        """Write the manifest atomically; this is what makes the checkpoint exist."""

    def uncommit(self, step: int) -> None:
        """Remove the manifest (before a step directory is overwritten)."""

    def file_state(self, step: int, rel: str, algorithm: str = SHA256) -> tuple[int, str] | None:
        """(size, digest under ``algorithm``) of a file, or None when missing or unreadable."""

    def file_size(self, step: int, rel: str) -> int:
        """Size, -1 when missing."""

    def read_bytes(self, step: int, rel: str) -> bytes: ...

    def write_bytes(self, step: int, rel: str, data: bytes) -> None:
        """Atomic write of one file (used for replicas and healing)."""

    def delete(self, step: int) -> None: ...

    def retire(self, step: int) -> None:
        """Stop keeping a step (uncommitted first). A recycling tier keeps its files as spares for
        the next save (:meth:`take_spare`); others delete it."""

    def take_spare(self, rel: str, dest: Path) -> bool:
        """Move the spare file ``rel`` (a path inside a step directory) to ``dest``, to be
        overwritten in place; False when there is none."""


#: The directory under ``<root>/<job>`` where a recycling tier keeps the step it retired last.
SPARE_DIRNAME = ".spare"


class DirectoryStorage:
    """A tier in a directory tree (tmpfs, local disk, or a shared mount)."""

    def __init__(
        self, name: str, root: str | os.PathLike[str], job: str, *, fsync: bool = True, recycle: bool = False,
    ) -> None:
        self.name = name
        self.base = Path(root) / job
        self.fsync = fsync
        #: Retired steps' files are overwritten by the next save instead of deleted (node tiers).
        self.recycle = recycle

    def step_dir(self, step: int) -> Path:
        return self.base / step_dirname(step)

    def list_steps(self) -> list[int]:
        try:
            names = os.listdir(self.base)
        except FileNotFoundError:
            return []
        steps = []
        for n in names:
            if n.startswith("step-") and n[5:].isdigit():
                steps.append(int(n[5:]))
        return sorted(steps)

    def read_manifest(self, step: int) -> Manifest | None:
        try:
            text = (self.step_dir(step) / MANIFEST_NAME).read_text()
            m = Manifest.from_json(text)
        except (OSError, UnicodeDecodeError, ManifestError):
            return None
        return m if m.step == step and m.tier == self.name else None

    def commit(self, step: int, manifest: Manifest) -> None:
        self.write_bytes(step, MANIFEST_NAME, manifest.to_json().encode())

    def uncommit(self, step: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.step_dir(step) / MANIFEST_NAME)

    def file_state(self, step: int, rel: str, algorithm: str = SHA256) -> tuple[int, str] | None:
        return file_digest(self.step_dir(step) / rel, algorithm)

    def file_size(self, step: int, rel: str) -> int:
        try:
            return os.stat(self.step_dir(step) / rel).st_size
        except OSError:
            return -1

    def read_bytes(self, step: int, rel: str) -> bytes:
        return (self.step_dir(step) / rel).read_bytes()

    def write_bytes(self, step: int, rel: str, data: bytes) -> None:
        path = self.step_dir(step) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if self.fsync:
            _fsync_dir(path.parent)

    def delete(self, step: int) -> None:
        d = self.step_dir(step)
        # Uncommit first: a half-deleted directory must never look like a checkpoint.
        self.uncommit(step)
        shutil.rmtree(d, ignore_errors=True)

    def retire(self, step: int) -> None:
        if not self.recycle:
            self.delete(step)
            return
        self.uncommit(step)
        spare = self.base / SPARE_DIRNAME
        # What the last save did not take (small files, or a layout that changed) goes now.
        shutil.rmtree(spare, ignore_errors=True)
        try:
            os.rename(self.step_dir(step), spare)
        except OSError:
            self.delete(step)

    def take_spare(self, rel: str, dest: Path) -> bool:
        if not self.recycle:
            return False
        try:
            os.rename(self.base / SPARE_DIRNAME / rel, dest)
        except OSError:  # none (or another process took it): the caller writes a new file
            return False
        return True


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def delete_job_checkpoints(roots: dict[str, str], job: str) -> list[str]:
    """Remove ``<root>/<job>`` in every given tier root; returns what was removed.

    The operator calls this (or runs ``python -m railyard_trainer.checkpoint.cleanup``, one pod
    per node for the node tiers) when a TrainingJob with ``cleanupOnDelete: true`` is deleted.
    """
    removed = []
    for _tier, root in sorted(roots.items()):
        if not root or not job or "/" in job or job in (".", ".."):
            continue
        base = Path(root) / job
        if base.is_dir():
            for step in sorted(base.iterdir()):
                # Manifests go first so an interrupted cleanup leaves nothing restorable-looking.
                with contextlib.suppress(OSError):
                    (step / MANIFEST_NAME).unlink()
            shutil.rmtree(base, ignore_errors=True)
            removed.append(str(base))
    return removed
