"""The controllers kube-controller-manager would run for this API: garbage collection by
ownerReferences (background, foreground, orphan), namespace deletion, CRD instance cleanup,
PodGroup protection (a deleted PodGroup goes once no running pod names it), each namespace's
``default`` ServiceAccount, and the resourceclaim controller (a pod's ResourceClaims made from
its templates, recorded in ``status.resourceClaimStatuses``; deleted once the pod is done).

They react to writes (``on_write``, called synchronously by the engine) by queueing work, and do
the work in one asyncio task so that they never race each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Coroutine
from typing import Any

from . import dra
from .cordon import NodeCorrections
from .crd import established_status
from .disruption import DisruptionController
from .engine import Ctx, DeleteOptions, Engine
from .errors import APIError
from .events import record_event
from .registry import CRD_KEY, ResourceType
from .store import Entry, ObjKey
from .taintmanager import TaintManager
from .workloads import PODGROUPS_KEY, PROTECTION_FINALIZER, group_of

log = logging.getLogger(__name__)


def parse_time(ts: str) -> float | None:
    try:
        return datetime.datetime.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None

JSON = dict[str, Any]
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
ROOT_CA_DESCRIPTION = ("Contains a CA bundle that can be used to verify the kube-apiserver when using internal "
                       "endpoints such as the internal service IP or kubernetes.default.svc. No other usage is "
                       "guaranteed across distributions of Kubernetes clusters.")


def namespace_children(ns: str, ca_bundle: str) -> list[JSON]:
    """What kube-controller-manager adds to every namespace: the ``default`` ServiceAccount and
    the ``kube-root-ca.crt`` ConfigMap (the API server's CA, for in-cluster clients)."""
    return [
        {"_rkey": "serviceaccounts", "apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "default", "namespace": ns}},
        {"_rkey": "configmaps", "_manager": "kube-controller-manager", "apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "kube-root-ca.crt", "namespace": ns,
                      "annotations": {"kubernetes.io/description": ROOT_CA_DESCRIPTION}},
         "data": {"ca.crt": ca_bundle}},
    ]


def _terminal(pod: JSON) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class Controllers:
    def __init__(self, engine: Engine, ca_bundle: str = "") -> None:
        self.engine = engine
        self.ca_bundle = ca_bundle
        self.store = engine.store
        self._gone_owners: set[str] = set()
        self._pending_owners: set[ObjKey] = set()
        self._terminating: set[ObjKey] = set()
        self._new_namespaces: set[str] = set()
        self._terminating_pods: set[ObjKey] = set()
        self._new_crds: set[str] = set()
        self._protected_groups: set[ObjKey] = set()
        self._claiming_pods: set[ObjKey] = set()
        self._releasing_claims: set[ObjKey] = set()
        self._missing_templates: set[tuple[str, str]] = set()  # (pod uid, template) already reported
        self.disruption = DisruptionController(engine)
        self.node_corrections = NodeCorrections(engine)
        self.taint_manager = TaintManager(engine)
        self._compute_domains: set[ObjKey] = set()
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    # ---- event intake (synchronous, from the engine) ---------------------------------------

    def on_write(self, rt: ResourceType, entry: Entry, deleted: bool) -> None:
        meta = entry.obj["metadata"]
        key: ObjKey = (rt.key, meta.get("namespace", ""), meta["name"])
        uid = meta.get("uid", "")
        kick = False
        if rt.key in ("configmaps", "serviceaccounts") and meta["name"] in ("kube-root-ca.crt", "default") and (
                deleted or (rt.key == "configmaps" and (entry.obj.get("data") or {}).get("ca.crt") != self.ca_bundle)):
            self._new_namespaces.add(meta.get("namespace", ""))
            kick = True
        if deleted:
            if uid in self.store.dependents:
                self._gone_owners.add(uid)
                kick = True
            for ref in meta.get("ownerReferences") or []:
                owner = self.store.by_uid.get(ref.get("uid", ""))
                if owner is not None and owner in self._pending_owners:
                    kick = True
            if self._terminating:
                kick = True
            if rt.key == "pods" and self._protected_groups:
                kick = True
            if rt.key == "pods":
                kick |= self._release_claims_of(meta.get("namespace", ""), uid)
        else:
            fins = meta.get("finalizers") or []
            if meta.get("deletionTimestamp"):
                if "foregroundDeletion" in fins or "orphan" in fins:
                    self._pending_owners.add(key)
                    kick = True
                if rt.key == "namespaces" or (rt.key == CRD_KEY
                                              and "customresourcecleanup.apiextensions.k8s.io" in fins):
                    self._terminating.add(key)
                    kick = True
                if rt.key == "pods" and (entry.obj.get("spec") or {}).get("nodeName"):
                    self._terminating_pods.add(key)
                if rt.key == PODGROUPS_KEY and PROTECTION_FINALIZER in fins:
                    self._protected_groups.add(key)
                    kick = True
            elif rt.key == "namespaces":
                self._new_namespaces.add(meta["name"])
                kick = True
            elif rt.key == CRD_KEY:
                self._new_crds.add(meta["name"])
                kick = True
            if rt.key == "pods" and _terminal(entry.obj):
                kick |= self._release_claims_of(meta.get("namespace", ""), uid)
            if rt.key == dra.CLAIMS_KEY and meta.get("deletionTimestamp"):
                self._releasing_claims.add(key)
                kick = True
            if rt.key == "pods" and dra.pod_claims_from_templates(entry.obj):
                self._claiming_pods.add(key)
                kick = True
            if rt.key == dra.COMPUTE_DOMAINS_KEY and not meta.get("deletionTimestamp"):
                self._compute_domains.add(key)
                kick = True
            if rt.key == dra.TEMPLATES_KEY and self._claiming_pods:
                kick = True  # pods waiting for this template
            if rt.key == "pods" and self._protected_groups and _terminal(entry.obj) and \
                    (PODGROUPS_KEY, meta.get("namespace", ""), group_of(entry.obj)) in self._protected_groups:
                kick = True
            for ref in meta.get("ownerReferences") or []:
                if ref.get("uid") and ref["uid"] not in self.store.by_uid:
                    self._gone_owners.add(ref["uid"])
                    kick = True
        if rt.key in ("pods", "poddisruptionbudgets.policy") or rt.crd is not None:
            kick |= self.disruption.on_write(rt.key, entry)
        if rt.key == "nodes" and not deleted:
            kick |= self.node_corrections.on_write(entry)
        if rt.key in ("nodes", "pods") and not deleted:
            kick |= self.taint_manager.on_write(rt.key, entry)
        if kick:
            self._kick.set()

    def _release_claims_of(self, ns: str, pod_uid: str) -> bool:
        """Queue the claims reserved for a pod that is gone or done; whether there were any."""
        found = False
        for claim in self.store.items(dra.CLAIMS_KEY, ns):
            if pod_uid in dra.reserved_pod_uids(claim.obj):
                self._releasing_claims.add((dra.CLAIMS_KEY, ns, claim.obj["metadata"]["name"]))
                found = True
        return found

    # ---- lifecycle -------------------------------------------------------------------------

    async def bootstrap(self) -> None:
        ns_rt = self.engine.registry.by_key("namespaces")
        assert ns_rt is not None
        for name in DEFAULT_NAMESPACES:
            if self.store.get("namespaces", "", name) is None:
                await self.engine.create(ns_rt, "", {"metadata": {"name": name}}, Ctx())
        for rkey in self.store.resource_keys():
            rt = self.engine.registry.by_key(rkey)
            if rt is None:
                continue
            for e in self.store.items(rkey):
                self.on_write(rt, e, False)
        for uid in list(self.store.dependents):
            if uid not in self.store.by_uid:
                self._gone_owners.add(uid)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="apiserver-controllers")
        self._kick.set()

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while not self._stopped:
            busy = bool(self._pending_owners or self._terminating or self._terminating_pods
                        or self.disruption.next_expiry() is not None or self.taint_manager.next_deadline() is not None)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0 if busy else 30.0):
                    await self._kick.wait()
            self._kick.clear()
            try:
                await self._process()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("controller pass failed; retrying")
                await asyncio.sleep(0.5)

    # ---- work ------------------------------------------------------------------------------

    def _rt(self, rkey: str) -> ResourceType | None:
        return self.engine.registry.by_key(rkey)

    async def _delete(self, key: ObjKey, policy: str | None = None) -> None:
        rt = self._rt(key[0])
        if rt is None:
            return
        entry = self.store.get(*key)
        if entry is None or entry.obj["metadata"].get("deletionTimestamp"):
            return
        with contextlib.suppress(APIError):
            await self.engine.delete(rt, key[1], key[2], DeleteOptions(propagation_policy=policy), Ctx())

    async def _process(self) -> None:
        for name in list(self._new_namespaces):
            self._new_namespaces.discard(name)
            await self._ensure_service_account(name)
        for name in list(self._new_crds):
            self._new_crds.discard(name)
            await self._establish_crd(name)
        for uid in list(self._gone_owners):
            self._gone_owners.discard(uid)
            await self._collect_dependents(uid)
        for key in list(self._pending_owners):
            await self._process_owner(key)
        for key in list(self._terminating):
            await self._process_terminating(key)
        for key in list(self._terminating_pods):
            await self._process_terminating_pod(key)
        for key in list(self._protected_groups):
            await self._process_protected_group(key)
        for key in list(self._compute_domains):
            self._compute_domains.discard(key)
            await self._ensure_channel_template(key)
        for key in list(self._claiming_pods):
            await self._process_claiming_pod(key)
        for key in list(self._releasing_claims):
            self._releasing_claims.discard(key)
            await self._release_claim(key)
        expiry = self.disruption.next_expiry()
        if expiry is not None and expiry <= self.engine.clock():
            for pdb in self.store.items("poddisruptionbudgets.policy"):
                self.disruption.on_write("poddisruptionbudgets.policy", pdb)
        await self.disruption.process()
        await self.node_corrections.process()
        await self.taint_manager.process()

    async def _release_claim(self, key: ObjKey) -> None:
        """The resourceclaim controller's cleanup (dra.release_claim): gone pods leave reservedFor,
        an unreserved claim is deallocated, a deleted one loses the delete-protection finalizer."""
        entry, rt = self.store.get(*key), self._rt(dra.CLAIMS_KEY)
        if entry is None or rt is None:
            return
        live = {p.obj["metadata"].get("uid", "") for p in self.store.items("pods", key[1])
                if not _terminal(p.obj) and not p.obj["metadata"].get("deletionTimestamp")}
        status, unprotect = dra.release_claim(entry.obj, live)
        if status is not None:
            obj = entry.clone()
            obj["status"] = status
            entry = await self.engine.write_raw(rt, obj)
        if unprotect:
            await self.engine.remove_finalizer(rt, entry, dra.DELETE_PROTECTION)

    async def _ensure_channel_template(self, key: ObjKey) -> None:
        """NVIDIA's DRA driver's part: a ComputeDomain's channel ResourceClaimTemplate (dra.py)."""
        entry = self.store.get(*key)
        rt = self._rt(dra.TEMPLATES_KEY)
        template = dra.channel_template_for(entry.obj) if entry is not None else None
        if rt is None or template is None or self.store.get(dra.TEMPLATES_KEY, key[1], template["metadata"]["name"]):
            return
        with contextlib.suppress(APIError):
            await self.engine.create(rt, key[1], template, Ctx(manager="compute-domain-controller"))

    async def _process_claiming_pod(self, key: ObjKey) -> None:
        """The resourceclaim controller: a ResourceClaim from the template for each of the pod's
        claims that has none yet, then the pod's ``status.resourceClaimStatuses``; a pod that is
        done gets its generated claims deleted (a deleted pod's go by ownerReference). A pod
        whose template does not exist yet waits for it."""
        entry = self.store.get(*key)
        pods_rt, claims_rt = self._rt("pods"), self._rt(dra.CLAIMS_KEY)
        if entry is None or pods_rt is None or claims_rt is None or entry.obj["metadata"].get("deletionTimestamp"):
            self._claiming_pods.discard(key)
            return
        pod, ns = entry.obj, key[1]
        uid = pod["metadata"].get("uid", "")
        if _terminal(pod):
            self._claiming_pods.discard(key)
            done = [
                c.obj["metadata"]["name"]
                for c in self.store.items(dra.CLAIMS_KEY, ns)
                if dra.is_generated_for(c.obj, uid)
            ]
            await asyncio.gather(*(self._delete((dra.CLAIMS_KEY, ns, n)) for n in done))
            return
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        recorded = {s.get("name") for s in statuses}
        missing = [(c, t) for c, t in dra.pod_claims_from_templates(pod) if c not in recorded]
        if not missing:
            self._claiming_pods.discard(key)
            return
        made = {c.obj["metadata"]["annotations"][dra.POD_CLAIM_ANNOTATION]: c.obj["metadata"]["name"]
                for c in self.store.items(dra.CLAIMS_KEY, ns) if dra.is_generated_for(c.obj, uid)}
        for claim, template_name in missing:
            if claim not in made:
                template = self.store.get(dra.TEMPLATES_KEY, ns, template_name)
                if template is None:  # stays queued: a template's creation kicks us again
                    if (uid, template_name) not in self._missing_templates:
                        self._missing_templates.add((uid, template_name))
                        await record_event(self.engine, {"apiVersion": "v1", "kind": "Pod", **pod},
                                           reason="FailedResourceClaimCreation", kind="Warning",
                                           component="resource_claim",
                                           message=f'PodResourceClaim {claim}: resource claim template '
                                                   f'"{template_name}": resourceclaimtemplate.resource.k8s.io '
                                                   f'"{template_name}" not found')
                    return
                created = await self.engine.create(claims_rt, ns, dra.claim_for_pod(pod, claim, template.obj),
                                                   Ctx(manager="kube-controller-manager"))
                made[claim] = created.obj["metadata"]["name"]
            statuses.append({"name": claim, "resourceClaimName": made[claim]})
        cur = self.store.get(*key)
        if cur is None or cur.obj["metadata"].get("uid") != uid:
            return
        # kcm writes it by server-side apply of its own (manager ResourceClaimController), as recorded
        config = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": key[2], "namespace": ns, "uid": uid},
                  "status": {"resourceClaimStatuses": statuses}}
        await self.engine.apply(pods_rt, ns, key[2], config, Ctx(manager="ResourceClaimController", force=True),
                                "status")
        self._claiming_pods.discard(key)

    async def _process_protected_group(self, key: ObjKey) -> None:
        """PodGroup protection: a deleted PodGroup keeps its finalizer while a pod that has not
        finished names it (the scheduler may still need it); then the finalizer goes."""
        entry = self.store.get(*key)
        rt = self._rt(key[0])
        if entry is None or rt is None or not entry.obj["metadata"].get("deletionTimestamp") or \
                PROTECTION_FINALIZER not in (entry.obj["metadata"].get("finalizers") or []):
            self._protected_groups.discard(key)
            return
        for pod in self.store.items("pods", key[1]):
            if group_of(pod.obj) == key[2] and not _terminal(pod.obj):
                return
        self._protected_groups.discard(key)
        await self.engine.remove_finalizer(rt, entry, PROTECTION_FINALIZER)

    async def _ensure_service_account(self, ns: str) -> None:
        """The ServiceAccount and root-CA publishers: every live namespace has both objects."""
        entry = self.store.get("namespaces", "", ns)
        if entry is None or entry.obj["metadata"].get("deletionTimestamp"):
            return
        for child in namespace_children(ns, self.ca_bundle):
            rt = self._rt(child.pop("_rkey"))
            manager = child.pop("_manager", None)
            assert rt is not None
            cur = self.store.get(rt.key, ns, child["metadata"]["name"])
            if cur is None:
                with contextlib.suppress(APIError):
                    await self.engine.create(rt, ns, child, Ctx(manager=manager))
            elif rt.key == "configmaps" and (cur.obj.get("data") or {}).get("ca.crt") != self.ca_bundle:
                obj = cur.clone()
                obj["data"] = {"ca.crt": self.ca_bundle}
                with contextlib.suppress(APIError):
                    await self.engine.update(rt, ns, obj["metadata"]["name"], obj, Ctx(manager=manager))

    async def _establish_crd(self, name: str) -> None:
        """The apiextensions controllers: accept the names, mark the CRD Established."""
        entry = self.store.get(CRD_KEY, "", name)
        rt = self._rt(CRD_KEY)
        if entry is None or rt is None or entry.obj["metadata"].get("deletionTimestamp"):
            return
        status = established_status(entry.obj, self.engine.now())
        if status is not None:
            obj = entry.clone()
            obj["status"] = status
            await self.engine.write_raw(rt, obj)

    async def _collect_dependents(self, owner_uid: str) -> None:
        if owner_uid in self.store.by_uid:
            return
        work: list[Coroutine[Any, Any, None]] = []
        for key in list(self.store.dependents.get(owner_uid, ())):
            entry = self.store.get(*key)
            if entry is None:
                continue
            refs = entry.obj["metadata"].get("ownerReferences") or []
            alive = [r for r in refs if r.get("uid") in self.store.by_uid]
            if not alive:
                work.append(self._delete(key))
            elif len(alive) != len(refs):
                work.append(self._set_owner_refs(key, alive))
        # each coroutine writes before its first await, so running them together is safe and
        # lets one group commit carry a whole gang's deletions
        await asyncio.gather(*work)

    async def _set_owner_refs(self, key: ObjKey, refs: list[JSON]) -> None:
        rt = self._rt(key[0])
        entry = self.store.get(*key)
        if rt is None or entry is None:
            return
        obj = entry.clone()
        if refs:
            obj["metadata"]["ownerReferences"] = refs
        else:
            obj["metadata"].pop("ownerReferences", None)
        await self.engine.write_raw(rt, obj)

    async def _process_owner(self, key: ObjKey) -> None:
        entry = self.store.get(*key)
        rt = self._rt(key[0])
        if entry is None or rt is None or not entry.obj["metadata"].get("deletionTimestamp"):
            self._pending_owners.discard(key)
            return
        meta = entry.obj["metadata"]
        uid = meta["uid"]
        fins = meta.get("finalizers") or []
        deps = list(self.store.dependents.get(uid, ()))
        if "orphan" in fins:
            for dep in deps:
                d = self.store.get(*dep)
                if d is not None:
                    refs = [r for r in d.obj["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                    await self._set_owner_refs(dep, refs)
            cur = self.store.get(*key)
            if cur is not None:
                await self.engine.remove_finalizer(rt, cur, "orphan")
            self._pending_owners.discard(key)
            return
        if "foregroundDeletion" in fins:
            await asyncio.gather(*(self._delete(dep, "Foreground") for dep in deps))
            blocking = 0
            for dep in deps:
                d = self.store.get(*dep)
                if d is None:
                    continue
                refs = d.obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == uid and r.get("blockOwnerDeletion") for r in refs):
                    blocking += 1
            if blocking == 0:
                cur = self.store.get(*key)
                if cur is not None:
                    await self.engine.remove_finalizer(rt, cur, "foregroundDeletion")
                self._pending_owners.discard(key)
            return
        self._pending_owners.discard(key)

    async def _process_terminating_pod(self, key: ObjKey) -> None:
        """Pod GC: a terminating pod whose node does not exist has nobody to confirm its deletion;
        remove it once its grace period is over (kube-controller-manager's PodGC does the same)."""
        entry = self.store.get(*key)
        rt = self._rt("pods")
        if entry is None or rt is None or not entry.obj["metadata"].get("deletionTimestamp"):
            self._terminating_pods.discard(key)
            return
        node = (entry.obj.get("spec") or {}).get("nodeName", "")
        if self.store.get("nodes", "", node) is not None:
            return
        deadline = parse_time(entry.obj["metadata"]["deletionTimestamp"])
        if deadline is not None and deadline > self.engine.clock():
            return
        obj = entry.clone()
        obj["metadata"]["deletionGracePeriodSeconds"] = 0
        self._terminating_pods.discard(key)
        await self.engine.write_raw(rt, obj, delete=not obj["metadata"].get("finalizers"))

    def _has_content(self, ns: str) -> bool:
        for rkey in self.store.resource_keys():
            crt = self._rt(rkey)
            if crt is not None and crt.namespaced and any(True for _ in self.store.items(rkey, ns)):
                return True
        return False

    async def _process_terminating(self, key: ObjKey) -> None:
        entry = self.store.get(*key)
        rt = self._rt(key[0])
        if entry is None or rt is None:
            self._terminating.discard(key)
            return
        if key[0] == "namespaces":
            ns = key[2]
            work: list[Coroutine[Any, Any, None]] = []
            for rkey in self.store.resource_keys():
                crt = self._rt(rkey)
                if crt is None or not crt.namespaced:
                    continue
                work.extend(self._delete((rkey, ns, e.obj["metadata"]["name"])) for e in self.store.items(rkey, ns))
            await asyncio.gather(*work)
            cur = self.store.get(*key)
            if cur is not None and not self._has_content(ns):
                obj = cur.clone()
                obj.setdefault("spec", {})["finalizers"] = []
                if obj["metadata"].get("finalizers"):
                    await self.engine.write_raw(rt, obj)
                else:
                    await self.engine.write_raw(rt, obj, delete=True)
                self._terminating.discard(key)
        else:
            crd = entry.obj
            cr_key = f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"
            await asyncio.gather(*(self._delete((cr_key, e.obj["metadata"].get("namespace", ""),
                                                  e.obj["metadata"]["name"])) for e in self.store.items(cr_key)))
            if not any(True for _ in self.store.items(cr_key)):
                cur = self.store.get(*key)
                if cur is not None:
                    await self.engine.remove_finalizer(rt, cur, "customresourcecleanup.apiextensions.k8s.io")
                self._terminating.discard(key)
