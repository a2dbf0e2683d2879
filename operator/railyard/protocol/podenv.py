"""The pod environment: every ``RAILYARD_*`` variable the operator sets and the trainer reads,
written once for both sides (name, meaning, how it parses, its default). The operator's
manifests write them with :meth:`EnvVar.entry`; the trainer reads them with ``get``. A value
that does not parse raises :class:`PodEnvError`, which names the variable and what it expects.

Stdlib only (railyard.protocol)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class PodEnvError(ValueError):
    """A pod environment variable that does not parse; the message names it and what it expects."""


@dataclass(frozen=True)
class EnvVar:
    """One variable of the pod contract: its ``name`` and what it means (``doc``)."""

    name: str
    doc: str

    def raw(self, env: Mapping[str, str]) -> str:
        """The value as set, stripped ("" when unset)."""
        return env.get(self.name, "").strip()

    def is_set(self, env: Mapping[str, str]) -> bool:
        return bool(self.raw(env))

    def entry(self, value: str) -> dict[str, Any]:
        """A container ``env`` entry that sets this variable to ``value``."""
        return {"name": self.name, "value": value}

    def field_entry(self, field_path: str) -> dict[str, Any]:
        """A container ``env`` entry that sets this variable from the pod's own ``field_path``."""
        return {"name": self.name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}

    def secret_entry(self, secret: str, key: str) -> dict[str, Any]:
        """A container ``env`` entry that sets this variable from ``key`` of Secret ``secret``."""
        return {"name": self.name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}

    def _bad(self, raw: str, expected: str) -> PodEnvError:
        return PodEnvError(f"{self.name}: expected {expected}, got {raw!r}")


@dataclass(frozen=True)
class Text(EnvVar):
    default: str = ""

    def get(self, env: Mapping[str, str]) -> str:
        return self.raw(env) or self.default


@dataclass(frozen=True)
class Whole(EnvVar):
    """A whole number >= 0; ``default`` (None: not given) when unset or empty."""

    default: int | None = None

    def get(self, env: Mapping[str, str]) -> int | None:
        raw = self.raw(env)
        if not raw:
            return self.default
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < 0:
            raise self._bad(raw, "a whole number >= 0")
        return value

    def render(self, value: int) -> str:
        return str(value)


@dataclass(frozen=True)
class Seconds(EnvVar):
    """A number of seconds >= 0; ``default`` when unset or empty."""

    default: float = 0.0

    def get(self, env: Mapping[str, str]) -> float:
        raw = self.raw(env)
        if not raw:
            return self.default
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise self._bad(raw, "a number of seconds >= 0")
        return value

    def render(self, value: float) -> str:
        return f"{value:g}"


@dataclass(frozen=True)
class Flag(EnvVar):
    """On or off: ``0`` turns a default-on flag off, ``1`` turns a default-off flag on; any
    other value leaves it at ``default``."""

    default: bool = False

    def get(self, env: Mapping[str, str]) -> bool:
        raw = self.raw(env)
        return raw != "0" if self.default else raw == "1"

    def render(self, value: bool) -> str:
        return "1" if value else "0"


@dataclass(frozen=True)
class Triple(EnvVar):
    """Three whole numbers ``a,b,c`` (a mesh's (pp, dp, tp)); None when unset or empty."""

    def get(self, env: Mapping[str, str]) -> tuple[int, int, int] | None:
        raw = self.raw(env)
        if not raw:
            return None
        try:
            a, b, c = (int(x) for x in raw.split(","))
        except ValueError:
            raise self._bad(raw, "'pp,dp,tp' (three whole numbers)") from None
        return a, b, c

    def render(self, value: tuple[int, int, int]) -> str:
        return ",".join(map(str, value))


# -- set by the operator on every trainer container (docs/trainer.md, "The pod contract") --------

CONFIG = Text("RAILYARD_CONFIG", "the trainer's config.json (the job ConfigMap, mounted at /etc/railyard)")
RANK_TABLE = Text("RAILYARD_RANK_TABLE", "the rank table JSON: a path, or the JSON itself")
POD_INDEX = Whole("RAILYARD_POD_INDEX", "this pod's index in the rank table")
POD_NAME = Text("RAILYARD_POD_NAME", "this pod's name; the operator answers `stop` to a pod not of the current gang")
NODE_NAME = Text("RAILYARD_NODE_NAME", "the node this pod runs on")
JOB = Text("RAILYARD_JOB", "the TrainingJob's name")
NAMESPACE = Text("RAILYARD_NAMESPACE", "the TrainingJob's namespace")
ATTEMPT = Whole("RAILYARD_ATTEMPT", "the gang's attempt; the launcher sets it again for each in-place generation")
MASTER_ADDR = Text("MASTER_ADDR", "torch's rendezvous host: the first pod of this pod's gang (or replica group)")
MASTER_PORT = Whole("MASTER_PORT", "torch's rendezvous port")
HEARTBEAT_URL = Text("RAILYARD_HEARTBEAT_URL", "where the pod posts heartbeats (empty: none are sent)")
HEARTBEAT_TOKEN = Text("RAILYARD_HEARTBEAT_TOKEN", "the job's bearer token for heartbeats and control (a Secret)")
CONTROL_URL = Text(
    "RAILYARD_CONTROL_URL", "the operator's in-place restart control endpoint (empty: no in-place restarts)"
)
CHECKPOINT_MEMORY_DIR = Text(
    "RAILYARD_CHECKPOINT_MEMORY_DIR", "the memory checkpoint tier's folder (empty: no such tier)"
)
CHECKPOINT_LOCAL_DIR = Text("RAILYARD_CHECKPOINT_LOCAL_DIR", "the local checkpoint tier's folder (empty: no such tier)")
CHECKPOINT_SHARED_DIR = Text(
    "RAILYARD_CHECKPOINT_SHARED_DIR", "the shared checkpoint tier's folder (empty: no such tier)"
)
#: The checkpoint tiers' folders, by tier name (railyard.protocol.manifest.TIERS).
CHECKPOINT_DIRS: Mapping[str, Text] = {
    "memory": CHECKPOINT_MEMORY_DIR,
    "local": CHECKPOINT_LOCAL_DIR,
    "shared": CHECKPOINT_SHARED_DIR,
}
TERMINATION_LOG = Text(
    "RAILYARD_TERMINATION_LOG",
    "the container's terminationMessagePath; the launcher writes its failure summary there",
)
#: faultTolerance ReplicaGroups: this pod's replica group (its replica id in the quorum).
REPLICA_GROUP = Whole("RAILYARD_REPLICA_GROUP", "faultTolerance ReplicaGroups: this pod's replica group")
#: faultTolerance ReplicaGroups: the job's Lighthouse, ``http://HOST:PORT`` (torchft's own name).
LIGHTHOUSE = Text("TORCHFT_LIGHTHOUSE", "faultTolerance ReplicaGroups: the job's Lighthouse, http://HOST:PORT")
POD_IP = Text(
    "RAILYARD_POD_IP",
    "faultTolerance ReplicaGroups: the pod's IP (status.podIP), which torchft advertises to the Lighthouse "
    "and to healing peers instead of the pod's short hostname",
)

# -- set by the launcher for each worker process (railyard_trainer.worker_env) ---------------------

MESH_SHAPE = Triple("RAILYARD_MESH_SHAPE", "the mesh's (pp, dp, tp) sizes, from the rank table")
MESH_COORDS = Triple("RAILYARD_MESH_COORDS", "this rank's (pp, dp, tp) coordinates, from the rank table")
WORKER_ERROR_FILE = Text(
    "RAILYARD_WORKER_ERROR_FILE", "where a worker records its error (as torchrun's TORCHELASTIC_ERROR_FILE)"
)
SAVE_ORDER_FILE = Text(
    "RAILYARD_SAVE_ORDER_FILE", "where the launcher writes a just-in-time save order for its workers (a planned move)"
)

# -- knobs the launcher and trainer read (unset in a pod: the defaults hold) ----------------------

FAIL_GRACE_S = Seconds(
    "RAILYARD_FAIL_GRACE_S", "after one worker fails, how long the others get to report their own failure", 5.0
)
KILL_GRACE_S = Seconds("RAILYARD_KILL_GRACE_S", "how long a stopped worker gets between SIGTERM and SIGKILL", 10.0)
RESTART_KILL_GRACE_S = Seconds(
    "RAILYARD_RESTART_KILL_GRACE_S", "on an in-place restart, SIGTERM to SIGKILL for workers that still run", 2.0
)
RENDEZVOUS_WAIT_S = Seconds(
    "RAILYARD_RENDEZVOUS_WAIT_S", "how long workers wait for the rendezvous (and the Lighthouse)", 600.0
)
WORKER_ZYGOTE = Flag("RAILYARD_WORKER_ZYGOTE", "start workers from a pre-imported zygote (0: plain processes)", True)
CONTROL_IGNORE_ORDERS = Flag("RAILYARD_CONTROL_IGNORE_ORDERS", "test knob: the launcher ignores the operator's orders")
DISABLE_HEALTH = Flag("RAILYARD_DISABLE_HEALTH", "the bundled trainer sends no heartbeats")
PLAIN_CHECKPOINT = Flag("RAILYARD_PLAIN_CHECKPOINT", "use the plain checkpointer instead of the tiered one")
CHECKPOINT_CPU = Text(
    "RAILYARD_CHECKPOINT_CPU",
    "the checkpoint threads' CPU class: auto, idle or nice (railyard_trainer.checkpoint.settings)",
    "auto",
)
SPEED_PROBE = Flag("RAILYARD_SPEED_PROBE", "the SDK measures each rank's step speed (0: off)", True)
# -- the bundled trainer's tuning and test knobs (railyard_trainer.train) -------------------------

COMPILE = Text(
    "RAILYARD_COMPILE", "torch.compile the blocks: unset, empty or 0 = eager; 1 = inductor; else a backend's name"
)
META_INIT_PARAMS = Text(
    "RAILYARD_META_INIT_PARAMS",
    "above this many parameters the model is built on the meta device and initialised after sharding",
    "500000000",
)
PEAK_FLOPS = Text("RAILYARD_PEAK_FLOPS", "the accelerator's dense bf16 peak FLOP/s, for MFU (empty: by device name)")
LOG_ALL_RANKS = Flag("RAILYARD_LOG_ALL_RANKS", "every rank logs its steps, not only rank 0")
DUMP_GRADS = Text("RAILYARD_DUMP_GRADS", "debug: a folder each step's gradients are written to")
TEST_HOLD = Text(
    "RAILYARD_TEST_HOLD",
    "test hook: STEP:PATH[,STEP:PATH...], before step STEP (0: before the first quorum) wait until PATH exists",
)
SIMULATED_DEVICE_FILE = Text(
    "RAILYARD_SIMULATED_DEVICE_FILE", "test knob: a file whose device faults the speed probe simulates"
)
