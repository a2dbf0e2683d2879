"""The API server refusing one of the gang's own objects: a Failed phase (permanent) or a waiting
condition with a retry (quota, RBAC, throttling ...), the server's message in the condition and
an Event, and no half gang left behind. The table pure; the cycle in-process (fake GangIO)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job

from railyard.k8s.client import ApiError
from railyard.k8s.gang import create_pods
from railyard.logic.conditions import find_condition
from railyard.logic.rejections import PERMANENT_REASONS, decide_rejection

# what kube-apiserver answers (messages as it words them)
QUOTA = ('pods "j-a0-1" is forbidden: exceeded quota: team-gpus, requested: requests.nvidia.com/gpu=2, '
         'used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8')
PSS = ('pods "j-a0-0" is forbidden: violates PodSecurity "restricted:latest": restricted volume types '
       '(volumes "ckpt-memory", "ckpt-local" use restricted volume type "hostPath")')
RBAC = ('pods is forbidden: User "system:serviceaccount:railyard-system:railyard-operator" cannot create resource '
        '"pods" in API group "" in the namespace "team-a"')
TERMINATING = 'pods "j-a0-0" is forbidden: unable to create new content in namespace team-a because it is being terminated'
VAP = "pods \"j-a0-0\" is forbidden: ValidatingAdmissionPolicy 'no-hostpath' with binding 'no-hostpath' denied request: hostPath is not allowed"
WEBHOOK = 'admission webhook "validate.kyverno.svc-fail" denied the request: policy require-labels: label team is required'
INVALID = ('Pod "j-a0-1" is invalid: spec.containers[0].resources.requests[memory]: Invalid value: "lots": '
           "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
PRIORITY = 'pods "j-a0-0" is forbidden: no PriorityClass with name big-jobs was found'
TOO_LARGE = "etcdserver: request is too large"
CONFLICT = 'Operation cannot be fulfilled on pods "j-a0-0": the object has been modified; please apply your changes to the latest version and try again'


@pytest.mark.parametrize(("status", "reason", "message", "decided", "permanent"), [
    (403, "Forbidden", QUOTA, "QuotaExceeded", False),
    (403, "Forbidden", PSS, "PodSecurityViolation", True),
    (403, "Forbidden", RBAC, "OperatorNotPermitted", False),
    (403, "Forbidden", TERMINATING, "NamespaceTerminating", False),
    (403, "Forbidden", 'pods "j-a0-0" is forbidden: error looking up service account team-a/trainer: serviceaccount "trainer" not found',
     "ServiceAccountNotFound", False),
    (403, "Forbidden", PRIORITY, "PriorityClassNotFound", False),
    (403, "Forbidden", VAP, "AdmissionDenied", True),
    (400, "BadRequest", WEBHOOK, "AdmissionDenied", True),
    (422, "Invalid", INVALID, "ObjectInvalid", True),
    (400, "BadRequest", "the body of the request was in an unknown format", "ObjectInvalid", True),
    (413, "RequestEntityTooLarge", TOO_LARGE, "ObjectTooLarge", True),
    (409, "Conflict", CONFLICT, "Conflict", False),
    (404, "NotFound", 'namespaces "team-a" not found', "NotFound", False),
    (429, "TooManyRequests", "Too many requests, please try again later.", "TooManyRequests", False),
    (401, "Unauthorized", "Unauthorized", "Unauthorized", False),
    (503, "ServiceUnavailable", "etcdserver: leader changed", "ApiServerUnavailable", False),
    (0, "", "Cannot connect to host 10.0.0.1:6443", "ApiServerUnavailable", False),
    (418, "", "I'm a teapot", "ObjectRejected", True),
], ids=lambda v: str(v)[:24] if isinstance(v, str) else None)
def test_each_refusal_is_decided_by_the_table(status: int, reason: str, message: str, decided: str, permanent: bool) -> None:
    d = decide_rejection(status, reason, message, what="Pod j-a0-1")
    assert (d.reason, d.permanent) == (decided, permanent)
    assert message in d.message and "Pod j-a0-1" in d.message, "the server's own words, and what was refused"
    assert (d.retry_after_s > 0) == (not permanent) and ("trying again" in d.message) == (not permanent)
    assert (d.reason in PERMANENT_REASONS) == permanent


def cluster() -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(4)]


def status_body(status: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message, "code": status}


def headline(h: Harness) -> Any:
    return find_condition(h.status.conditions, "Failed" if h.status.phase == "Failed" else "Placed")


async def test_quota_refusal_waits_then_creates_the_whole_gang_when_there_is_room() -> None:
    h = Harness(cluster(), make_job())
    h.cluster.pod_create_error = (403, status_body(403, "Forbidden", QUOTA), 1)
    delay = await h.cycle()
    cond = headline(h)
    assert h.status.phase == "Placing" and cond.reason == "QuotaExceeded" and QUOTA in cond.message
    assert delay == pytest.approx(30.0) and not h.cluster.pods, "the half-created gang was rolled back"
    assert [r for t, r, _ in h.cluster.events if t == "Warning"] == ["QuotaExceeded"]
    # still no room: nothing is created before the retry is due, and the same reason says no more
    h.cluster.pod_create_error = None
    await h.cycle(10.0)
    assert not h.cluster.pods and h.status.phase == "Placing"
    await h.cycle(21.0)
    assert h.status.phase == "Starting" and len(h.cluster.pods_of(0)) == 2
    assert ("ConfigMap", "j-a0") in h.cluster.objects and h.status.next_attempt_time is None
    assert h.reasons().count("QuotaExceeded") == 1


async def test_a_missing_priority_class_waits_then_creates_the_gang_as_attempt_0() -> None:
    h = Harness(cluster(), make_job(gang={"priorityClassName": "big-jobs"}))
    h.cluster.pod_create_error = (403, status_body(403, "Forbidden", PRIORITY), 1)
    delay = await h.cycle()
    cond = headline(h)
    assert h.status.phase == "Placing" and cond.status == "False" and cond.reason == "PriorityClassNotFound", cond
    assert PRIORITY in cond.message and "(403 Forbidden)" in cond.message and "trying again in 10s" in cond.message, cond.message
    assert delay == pytest.approx(10.0) and not h.cluster.pods, "no half gang while it waits"
    assert [r for t, r, _ in h.cluster.events if t == "Warning"] == ["PriorityClassNotFound"]
    h.cluster.pod_create_error = None  # the PriorityClass now exists
    await h.cycle(10.0)
    assert h.status.phase == "Starting" and len(h.cluster.pods_of(0)) == 2
    assert h.status.attempt == 0 and h.status.restarts.total == 0, "a refusal is no restart"


async def test_pods_refused_by_pod_security_fail_the_job_saying_what_to_change() -> None:
    h = Harness(cluster(), make_job())
    h.cluster.pod_create_error = (403, status_body(403, "Forbidden", PSS), 1)
    assert await h.cycle() is None
    cond = headline(h)
    assert h.status.phase == "Failed" and cond.reason == "PodSecurityViolation", cond
    assert PSS in cond.message and "(403 Forbidden)" in cond.message and "pod-security.kubernetes.io/enforce" in cond.message, cond.message
    assert any(t == "Warning" and r == "PodSecurityViolation" and "violates PodSecurity" in m for t, r, m in h.cluster.events)
    assert not h.cluster.pods, "no half gang"


async def test_invalid_pods_fail_the_job_until_the_spec_changes() -> None:
    h = Harness(cluster(), make_job())
    h.cluster.pod_create_error = (422, status_body(422, "Invalid", INVALID), 1)
    assert await h.cycle() is None
    cond = headline(h)
    assert h.status.phase == "Failed" and cond.reason == "ObjectInvalid" and INVALID in cond.message
    assert not h.cluster.pods and ("ConfigMap", "j-a0") not in h.cluster.objects
    assert any(t == "Warning" and r == "ObjectInvalid" and INVALID in m for t, r, m in h.cluster.events)
    # nothing happens until the spec is edited (no silent retry) ...
    await h.cycle(60.0)
    assert h.status.phase == "Failed" and not h.cluster.pods
    creates = [c for c in h.cluster.calls if c[0] == "create" and c[1].startswith("Pod/")]
    assert len(creates) == 1, "the refused pod was created once, then rolled back"
    # ... a fixed spec starts the job again
    h.cluster.pod_create_error = None
    h.edit_spec(resources={"requests": {"memory": "1Gi"}})
    await h.cycle(1.0)
    assert h.status.phase == "Starting" and h.status.attempt == 1 and len(h.cluster.pods_of(1)) == 2


async def test_a_refused_service_fails_the_job_before_any_pod_exists() -> None:
    h = Harness(cluster(), make_job())
    message = 'Service "j" is invalid: metadata.name: Invalid value: "j": a DNS-1035 label must start with a letter'
    h.cluster.create_errors["Service"] = (422, status_body(422, "Invalid", message))
    await h.cycle()
    cond = headline(h)
    assert h.status.phase == "Failed" and cond.reason == "ObjectInvalid"
    assert "Service j" in cond.message and message in cond.message
    assert not h.cluster.pods


async def test_resuming_a_half_created_gang_that_is_refused_rolls_back_all_of_it() -> None:
    h = Harness(cluster(), make_job())
    await h.cycle()
    # an operator restarted under a gang that lost a pod; the API server now refuses the pod
    names = sorted(h.cluster.pods)
    del h.cluster.pods[names[1]]
    h.cluster.pods[names[0]]["spec"]["schedulingGates"] = [{"name": "railyard.dev/gang"}]
    h.worker.status_wire = None
    h.worker.body["status"] = {**h.cluster.status, "phase": "Placing"}
    h.cluster.status = dict(h.worker.body["status"])
    h.cluster.pod_create_error = (403, status_body(403, "Forbidden", PSS), 0)
    await h.cycle(1.0)
    assert h.status.phase == "Failed" and headline(h).reason == "PodSecurityViolation"
    assert not h.cluster.pods, "the pod that existed went too"


async def test_what_is_left_of_a_refused_gang_is_deleted_not_resumed() -> None:
    h = Harness(cluster(), make_job())
    h.cluster.pod_create_error = (403, status_body(403, "Forbidden", QUOTA), 1)
    # a slow watch: the pod created before the refusal (then deleted) is still in the index
    real_delete = h.cluster.delete_pods
    remembered: list[str] = []

    async def lagging_delete(namespace: str, names: Any, *, grace_seconds: int | None = None) -> int:
        remembered.extend(names)
        return 0

    h.cluster.delete_pods = lagging_delete  # type: ignore[method-assign]
    await h.cycle()
    assert h.status.phase == "Placing" and len(h.cluster.pods) == 1
    h.cluster.delete_pods = real_delete  # type: ignore[method-assign]
    h.cluster.pod_create_error = None
    await h.cycle(3.0)
    assert not h.cluster.pods, "not resumed as a half gang: deleted"
    assert not any(c[0] == "create" and c[1] == "Pod/j-a0-1" for c in h.cluster.calls)
    assert (h.status.phase, headline(h).reason, h.status.attempt) == ("Placing", "QuotaExceeded", 0), "still waiting for the retry"
    await h.cycle(30.0)
    assert h.status.phase == "Starting" and h.status.attempt == 0 and len(h.cluster.pods_of(0)) == 2


class _Kube:
    """Creates that answer in a given order: pod 0 is refused at once, the others later."""

    def __init__(self) -> None:
        self.done: list[str] = []

    async def create(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        if name.endswith("-0"):
            raise ApiError(403, status_body(403, "Forbidden", QUOTA), "POST", path)
        await asyncio.sleep(0.01)
        self.done.append(name)
        return body


async def test_create_pods_waits_for_every_create_before_raising() -> None:
    kube = _Kube()
    pods = [{"kind": "Pod", "metadata": {"name": f"j-a0-{i}", "namespace": "ns"}} for i in range(4)]
    with pytest.raises(ApiError) as err:
        await create_pods(kube, pods)  # type: ignore[arg-type]
    assert err.value.status == 403
    assert sorted(kube.done) == ["j-a0-1", "j-a0-2", "j-a0-3"], "no create is still in flight behind the roll-back"
