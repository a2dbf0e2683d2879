"""The simulated nodes' devices under Dynamic Resource Allocation (``resource.k8s.io/v1``), and
the pure rules the local scheduler allocates them by.

Each node with GPUs publishes what NVIDIA's DRA driver would: one ResourceSlice of driver
``gpu.nvidia.com`` (devices ``gpu-0`` .. ``gpu-{n-1}``, pool = the node) and one of driver
``compute-domain.nvidia.com`` with the node's IMEX channel (``channel-0``), both owned by the
Node (they go with it). The DeviceClasses ``gpu.nvidia.com`` and
``compute-domain-default-channel.nvidia.com`` select them by driver, as the driver's chart
installs them. The scheduler reads a class's driver from its CEL selector
(``device.driver == "..."``, the only selector evaluated) and allocates whole devices of that
driver on the chosen node, ExactCount only. No I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

Obj = Mapping[str, Any]

RESOURCE_API = "/apis/resource.k8s.io/v1"
GPU_DRIVER = "gpu.nvidia.com"
CHANNEL_DRIVER = "compute-domain.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
#: The scheduler's bookkeeping name for a driver's devices on a node (a pseudo resource, in
#: whole devices x 1000 like every other request), so that fit and gang decisions count them.
DEVICE_RESOURCE_PREFIX = "devices/"
#: Put on a claim by the scheduler before it allocates it; kcm removes it once the claim is deallocated.
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"

_DRIVER_SELECTOR = re.compile(r"""^\s*device\.driver\s*==\s*["']([^"']+)["']\s*$""")


def build_device_classes() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
         "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}}
        for name, driver in ((GPU_CLASS, GPU_DRIVER), (CHANNEL_CLASS, CHANNEL_DRIVER))
    ]


def slice_name(node: str, driver: str) -> str:
    return f"{node}-{driver}"


def build_slices(node: str, node_uid: str, gpus: int) -> list[dict[str, Any]]:
    """The node's ResourceSlices (none without GPUs)."""
    if gpus <= 0:
        return []
    owner = (
        [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}] if node_uid else []
    )
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": slice_name(node, driver), "ownerReferences": owner},
         "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": d} for d in devices]}}
        for driver, devices in ((GPU_DRIVER, [f"gpu-{i}" for i in range(gpus)]), (CHANNEL_DRIVER, ["channel-0"]))
    ]


def class_driver(device_class: Obj | None) -> str | None:
    """The driver a DeviceClass selects (its one ``device.driver == "..."`` selector), or None."""
    if device_class is None:
        return None
    for sel in (device_class.get("spec") or {}).get("selectors") or []:
        m = _DRIVER_SELECTOR.match(str(((sel or {}).get("cel") or {}).get("expression") or ""))
        if m:
            return m.group(1)
    return None


def claim_needs(claim: Obj, classes: Mapping[str, Obj]) -> tuple[dict[str, int], str | None]:
    """What an unallocated claim asks of one node, as pseudo-resource requests (milli-devices
    per driver), or a reason it cannot be allocated here."""
    needs: dict[str, int] = {}
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = (r or {}).get("exactly")
        if not isinstance(exactly, dict):
            return {}, f"request {r.get('name')!r}: only `exactly` requests are allocated here"
        if exactly.get("allocationMode", "ExactCount") != "ExactCount":
            return {}, f"request {r.get('name')!r}: only allocationMode ExactCount is allocated here"
        driver = class_driver(classes.get(str(exactly.get("deviceClassName"))))
        if driver is None:
            return {}, f'device class {exactly.get("deviceClassName")} does not exist or selects no driver'
        key = DEVICE_RESOURCE_PREFIX + driver
        needs[key] = needs.get(key, 0) + 1000 * int(exactly.get("count", 1))
    return needs, None


def node_devices(slices: Iterable[Obj]) -> dict[str, dict[str, list[str]]]:
    """node -> driver -> device names, from ResourceSlices."""
    out: dict[str, dict[str, list[str]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        node, driver = spec.get("nodeName"), spec.get("driver")
        if not node or not driver:
            continue
        out.setdefault(str(node), {}).setdefault(str(driver), []).extend(
            str(d.get("name")) for d in spec.get("devices") or [] if d.get("name"))
    return out


def allocated_devices(claims: Iterable[Obj]) -> set[tuple[str, str, str]]:
    """(driver, pool, device) of every device an allocated claim holds."""
    held: set[tuple[str, str, str]] = set()
    for c in claims:
        for r in ((((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []):
            held.add((str(r.get("driver")), str(r.get("pool")), str(r.get("device"))))
    return held


def build_allocation(claim: Obj, node: str, classes: Mapping[str, Obj], devices: Mapping[str, list[str]],
                     held: set[tuple[str, str, str]]) -> dict[str, Any] | None:
    """``status.allocation`` of ``claim`` on ``node`` (free devices in name order), or None when
    the node's free devices are too few."""
    results: list[dict[str, str]] = []
    taken = set(held)
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = r.get("exactly") or {}
        driver = class_driver(classes.get(str(exactly.get("deviceClassName"))))
        if driver is None:
            return None
        free = [d for d in devices.get(driver, []) if (driver, node, d) not in taken]
        count = int(exactly.get("count", 1))
        if len(free) < count:
            return None
        for d in free[:count]:
            taken.add((driver, node, d))
            results.append({"request": str(r.get("name")), "driver": driver, "pool": node, "device": d})
    return {
        "devices": {"results": results},
        "nodeSelector": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        },
    }
