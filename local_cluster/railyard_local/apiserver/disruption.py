"""PodDisruptionBudgets as a real v1.36 control plane enforces them: the eviction subresource
(kube-apiserver's ``pods/eviction``) and the status kube-controller-manager's disruption
controller computes (tests/golden/kube-v1.36-disruption/, recorded).

The pure rules are here: :func:`compute_pdb_status` (expectedPods, desiredHealthy,
currentHealthy, disruptionsAllowed, disruptedPods and the ``DisruptionAllowed`` condition) and
:func:`decide_eviction` (which budget, refused 429 with the ``DisruptionBudget`` cause, 500 for
two budgets, or allowed with the budget's decremented status). :class:`DisruptionController` runs
the first on every change of a budget or of a pod it may select; ``Engine.evict`` calls
:func:`evict`.

What a real one does and this one does too: a ``maxUnavailable`` (or a percentage) over pods
whose controller has no ``/scale`` subresource cannot be computed (``expectedPods 0``) and raises
a Warning ``UnmanagedPods`` event; an integer ``minAvailable`` counts the selected pods. A
terminating pod, a Pending or finished pod, and a pod no budget selects are evicted without a
budget check; an evicted pod gets ``DisruptionTarget=True`` (reason ``EvictionByEvictionAPI``)
before its graceful deletion.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .crd import scale_paths
from .engine import Ctx, DeleteOptions, Engine, rfc3339
from .errors import APIError, bad_request
from .events import record_event
from .registry import ResourceType
from .selectors import selector_from_match_labels
from .store import Entry, ObjKey

log = logging.getLogger(__name__)
JSON = dict[str, Any]

PDBS_KEY = "poddisruptionbudgets.policy"
#: How long an eviction's entry in ``disruptedPods`` waits for the pod's deletion (upstream's DeletionTimeout).
DELETION_TIMEOUT_S = 120.0
TOO_MANY = "Cannot evict pod as it would violate the pod's disruption budget."
TWO_BUDGETS = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
_UNMANAGED = ("Pods selected by this PodDisruptionBudget (selector: {selector}) were found to be unmanaged. As a "
              "result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. "
              "To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.")


def _time(ts: str) -> float:
    try:
        return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def selects(pdb: JSON, pod: JSON) -> bool:
    """policy/v1: an empty selector selects every pod of the namespace; no selector, none."""
    return pod_matcher(pdb)(pod)


def pod_matcher(pdb: JSON) -> Callable[[JSON], bool]:
    """:func:`selects` for one budget, its selector parsed once (a sync reads every pod of the
    namespace: a gang's 1,000 pods per pass while it is created)."""
    sel = (pdb.get("spec") or {}).get("selector")
    if sel is None:
        return lambda pod: False
    match = selector_from_match_labels(sel)
    return (lambda pod: True) if match is None else match


def is_ready(pod: JSON) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _scaled(value: Any, total: int, round_up: bool) -> int:
    """intstr.GetScaledValueFromIntOrPercent (a value that is neither counts as 0)."""
    try:
        if isinstance(value, str) and value.endswith("%"):
            share = int(value[:-1]) * total / 100
            return math.ceil(share) if round_up else math.floor(share)
        return int(value)
    except ValueError:
        return 0


@dataclass
class PdbStatus:
    status: JSON
    unmanaged: bool


def compute_pdb_status(pdb: JSON, pods: list[JSON], scale_of: Callable[[JSON], int | None], now: float) -> PdbStatus:
    """The disruption controller's ``trySync``: ``pods`` are those the budget selects,
    ``scale_of(pod)`` the replicas of its controller's /scale (None: no controller with one)."""
    spec = pdb.get("spec") or {}
    expected, desired, unmanaged = 0, 0, False

    def expected_scale() -> int:
        nonlocal unmanaged
        total, seen = 0, set()
        for pod in pods:
            refs = (pod.get("metadata") or {}).get("ownerReferences") or []
            ref = next((r for r in refs if r.get("controller")), None)
            replicas = scale_of(pod) if ref is not None else None
            if replicas is None:
                unmanaged = True
                continue
            if ref is not None and ref.get("uid") not in seen:
                seen.add(ref.get("uid"))
                total += replicas
        return total

    if spec.get("maxUnavailable") is not None:
        expected = expected_scale()
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, True))
    elif spec.get("minAvailable") is not None:
        if isinstance(spec["minAvailable"], int):
            desired, expected = spec["minAvailable"], len(pods)
        else:
            expected = expected_scale()
            desired = _scaled(spec["minAvailable"], expected, True)
    old = pdb.get("status") or {}
    disrupted: JSON = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        when = (old.get("disruptedPods") or {}).get(meta.get("name"))
        if meta.get("deletionTimestamp") or not when or _time(when) + DELETION_TIMEOUT_S < now:
            continue
        disrupted[meta["name"]] = when
    healthy = sum(1 for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")
                  and (p.get("metadata") or {}).get("name") not in disrupted and is_ready(p))
    allowed = healthy - desired if expected > 0 and healthy - desired > 0 else 0
    generation = (pdb.get("metadata") or {}).get("generation", 1)
    status: JSON = {"currentHealthy": healthy, "desiredHealthy": desired, "disruptionsAllowed": allowed,
                    "expectedPods": expected, "observedGeneration": generation}
    if disrupted:
        status["disruptedPods"] = disrupted
    status["conditions"] = [_allowed_condition(old, allowed, generation, rfc3339(now))]
    return PdbStatus(status, unmanaged)


def _allowed_condition(old_status: JSON, allowed: int, generation: int, now: str) -> JSON:
    """pdbhelper.UpdateDisruptionAllowedCondition: the transition time moves only with the status."""
    state, reason = ("True", "SufficientPods") if allowed > 0 else ("False", "InsufficientPods")
    old = next((c for c in old_status.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == state else now
    return {"type": "DisruptionAllowed", "status": state, "reason": reason, "message": "",
            "observedGeneration": generation, "lastTransitionTime": since}


@dataclass
class EvictionVerdict:
    """``budget``: the one budget to charge (None: evict without a check); ``new_status`` its
    status after the charge."""

    budget: JSON | None = None
    new_status: JSON | None = None


def ignores_budgets(pod: JSON) -> bool:
    """canIgnorePDB: a pod already terminating, finished, or not yet running."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) or phase in ("Succeeded", "Failed", "Pending")


def decide_eviction(pod: JSON, budgets: list[JSON], now: float, dry_run: bool) -> EvictionVerdict:
    """kube-apiserver's eviction REST handler on a pod the eviction may delete: raises the
    refusal as :class:`APIError` (429, 500), else says which budget to charge."""
    if ignores_budgets(pod):
        return EvictionVerdict()
    mine = [b for b in budgets if selects(b, pod)]
    if not mine:
        return EvictionVerdict()
    if len(mine) > 1:
        raise APIError(500, TWO_BUDGETS, reason="")
    pdb = mine[0]
    status = pdb.get("status") or {}
    name = (pdb.get("metadata") or {}).get("name")
    if not is_ready(pod) and int(status.get("currentHealthy", 0)) >= int(status.get("desiredHealthy", 0)) > 0:
        return EvictionVerdict()  # IfHealthyBudget: an unready pod goes while the budget is healthy
    if int(status.get("observedGeneration", 0)) < int((pdb.get("metadata") or {}).get("generation", 1)):
        raise _too_many(f"The disruption budget {name} is still being processed by the server.")
    allowed = int(status.get("disruptionsAllowed", 0))
    if allowed <= 0:
        if int(status.get("desiredHealthy", 0)) > 0:
            raise _too_many(f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods and "
                            f"has {status.get('currentHealthy', 0)} currently")
        raise _too_many(f"The disruption budget {name} does not allow evicting pods currently")
    new = json.loads(json.dumps(status))
    new["disruptionsAllowed"] = allowed - 1
    if not dry_run:
        new.setdefault("disruptedPods", {})[(pod.get("metadata") or {}).get("name")] = rfc3339(now)
    if allowed - 1 == 0:
        for c in new.get("conditions") or []:
            if c.get("type") == "DisruptionAllowed":
                c.update(status="False", reason="InsufficientPods")
    return EvictionVerdict(pdb, new)


def _too_many(cause: str) -> APIError:
    return APIError(429, TOO_MANY, reason="TooManyRequests",
                    details={"causes": [{"reason": "DisruptionBudget", "message": cause}]})


# ---- the I/O: the eviction subresource and the disruption controller ------------------------------


def _rt(engine: Engine, group: str, version: str, plural: str) -> ResourceType:
    rt = engine.registry.lookup(group, version, plural)
    assert rt is not None, plural
    return rt


async def evict(engine: Engine, ns: str, name: str, body: Any, ctx: Ctx) -> None:
    """POST pods/NAME/eviction (policy/v1 Eviction)."""
    pods = _rt(engine, "", "v1", "pods")
    if isinstance(body, dict) and ((body.get("metadata") or {}).get("name") or name) != name:
        raise bad_request("name in URL does not match name in Eviction object")
    entry = engine.get(pods, ns, name)
    opts = DeleteOptions()
    dry_run = ctx.dry_run
    if isinstance(body, dict) and isinstance(body.get("deleteOptions"), dict):
        do = body["deleteOptions"]
        opts.grace_period_seconds = do.get("gracePeriodSeconds")
        opts.propagation_policy = do.get("propagationPolicy")
        pre = do.get("preconditions") or {}
        opts.precondition_uid = pre.get("uid")
        opts.precondition_rv = pre.get("resourceVersion")
        dry_run = dry_run or "All" in (do.get("dryRun") or [])
    budgets = [e.obj for e in engine.store.items(PDBS_KEY, ns)]
    verdict = decide_eviction(entry.obj, budgets, engine.clock(), dry_run)
    if dry_run:
        return
    if verdict.budget is not None and verdict.new_status is not None:
        pdbs = _rt(engine, "policy", "v1", "poddisruptionbudgets")
        meta = verdict.budget["metadata"]
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": verdict.new_status}
        await engine.patch(pdbs, ns, meta["name"], "application/merge-patch+json", json.dumps(patch).encode(),
                           Ctx(manager="kube-apiserver"), "status")
    if not entry.obj["metadata"].get("deletionTimestamp"):
        obj = entry.clone()
        conditions = [c for c in (obj.setdefault("status", {}).get("conditions") or [])
                      if c.get("type") != "DisruptionTarget"]
        conditions.append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": engine.now(), "reason": "EvictionByEvictionAPI",
                           "message": "Eviction API: evicting"})
        obj["status"]["conditions"] = conditions
        await engine.write_raw(pods, obj)
    await engine.delete(pods, ns, name, opts, Ctx(manager=ctx.manager))


class DisruptionController:
    """kube-controller-manager's disruption controller: every budget's status recomputed when
    it or a pod of its namespace changes (and when an eviction's ``disruptedPods`` entry expires)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dirty: set[ObjKey] = set()
        self._warned: set[tuple[str, str]] = set()  # (budget uid, selector text): UnmanagedPods reported

    def on_write(self, rkey: str, entry: Entry) -> bool:
        """Queue the budgets a write may change; whether there is work."""
        meta = entry.obj["metadata"]
        ns = meta.get("namespace", "")
        if rkey == PDBS_KEY:
            self.dirty.add((PDBS_KEY, ns, meta["name"]))
        else:  # a pod, or a custom resource that may be a pod's controller (its scale)
            for pdb in self.engine.store.items(PDBS_KEY, ns):
                self.dirty.add((PDBS_KEY, ns, pdb.obj["metadata"]["name"]))
        return bool(self.dirty)

    async def process(self) -> None:
        for key in list(self.dirty):
            self.dirty.discard(key)
            with contextlib.suppress(APIError):
                await self._sync(key)

    def _scale_of(self, pod: JSON) -> int | None:
        ref = next((r for r in (pod.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")), None)
        owner = self.engine.store.by_uid.get(str((ref or {}).get("uid", "")))
        entry = self.engine.store.get(*owner) if owner is not None else None
        if entry is None or owner is None:
            return None
        rt = self.engine.registry.by_key(owner[0])
        path = ".spec.replicas" if owner[0] in (
            "deployments.apps", "statefulsets.apps", "replicasets.apps", "replicationcontrollers") else None
        if rt is not None and rt.crd is not None:
            path = (scale_paths(rt) or {}).get("specReplicasPath")
        if not path:
            return None
        cur: Any = entry.obj
        for part in path.lstrip(".").split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        return int(cur) if isinstance(cur, int) else 0

    async def _sync(self, key: ObjKey) -> None:
        entry = self.engine.store.get(*key)
        if entry is None or entry.obj["metadata"].get("deletionTimestamp"):
            return
        pdb = entry.obj
        match = pod_matcher(pdb)
        pods = [p.obj for p in self.engine.store.items("pods", key[1]) if match(p.obj)]
        computed = compute_pdb_status(pdb, pods, self._scale_of, self.engine.clock())
        if computed.unmanaged:
            selector = _go_selector((pdb.get("spec") or {}).get("selector") or {})
            if (pdb["metadata"]["uid"], selector) not in self._warned:
                self._warned.add((pdb["metadata"]["uid"], selector))
                await record_event(self.engine, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", **pdb},
                                   reason="UnmanagedPods", kind="Warning", component="controllermanager",
                                   message=_UNMANAGED.format(selector=selector))
        old = pdb.get("status") or {}
        if computed.status == old:
            return
        rt = _rt(self.engine, "policy", "v1", "poddisruptionbudgets")
        patch = {"metadata": {"resourceVersion": pdb["metadata"].get("resourceVersion")},
                 "status": {**{k: None for k in old if k not in computed.status}, **computed.status}}
        await self.engine.patch(rt, key[1], key[2], "application/merge-patch+json", json.dumps(patch).encode(),
                                Ctx(manager="kube-controller-manager"), "status")

    def next_expiry(self) -> float | None:
        """When the oldest ``disruptedPods`` entry times out (then the budgets are synced again)."""
        times = [_time(t) + DELETION_TIMEOUT_S for e in self.engine.store.items(PDBS_KEY)
                 for t in ((e.obj.get("status") or {}).get("disruptedPods") or {}).values()]
        return min(times) if times else None


def _go_selector(sel: JSON) -> str:
    """A LabelSelector as Go's %v prints the pointer to it (the UnmanagedPods message)."""
    labels = ",".join(f"{k}: {v}" for k, v in sorted((sel.get("matchLabels") or {}).items()))
    exprs = ",".join(f"LabelSelectorRequirement{{Key:{e.get('key')},Operator:{e.get('operator')},"
                     f"Values:[{' '.join(e.get('values') or [])}],}}" for e in sel.get("matchExpressions") or [])
    return (f"&LabelSelector{{MatchLabels:map[string]string{{{labels + ',' if labels else ''}}},"
            f"MatchExpressions:[]LabelSelectorRequirement{{{exprs}}},}}")

