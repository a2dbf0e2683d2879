"""Thin kopf glue: indexes of pods and nodes, event handlers that wake the job workers.

Nothing here decides anything, and nothing here is module state: the operator's
:class:`~railyard.handlers.runtime.Runtime` lives in kopf's memo (``memo.runtime``, given to
``kopf.operator(memo=...)`` by :func:`build_memo`; kopf hands every handler the same one). TrainingJob events start (or
feed) the job's worker; pod and node
events wake the workers they concern so a failure is acted on within the coalescing delay, not
after a timer. Event handlers (unlike kopf's change handlers and daemons) write no annotations
and add no finalizers, so the TrainingJob carries only what it asks for.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from railyard import GROUP, VERSION
from railyard.api.trainingjob import PLURAL
from railyard.handlers.cycle import KubeGangIO
from railyard.handlers.kueue import delete_workload
from railyard.handlers.nodes import on_node_change
from railyard.handlers.reconcile import reconcile_job
from railyard.handlers.runtime import OperatorSettings, Runtime
from railyard.logic.health.address import HEARTBEAT_URL_ENV
from railyard.logic.manifests import JOB_LABEL, NODE_ANNOTATION
from railyard.logic.topology import CLAIMED_GPUS_ANNOTATION

log = logging.getLogger(__name__)


def build_memo(settings: OperatorSettings) -> kopf.Memo:
    """kopf's memo for ``kopf.operator(memo=...)``: the operator's runtime with these settings."""
    return kopf.Memo(runtime=Runtime(settings, reconcile_job))


def runtime_of(memo: kopf.Memo) -> Runtime:
    """The runtime in kopf's memo; one with default settings when the operator was started
    without :func:`build_memo` (``kopf run`` on this module: the first activity sets it)."""
    runtime = memo.get("runtime")
    if runtime is None:
        runtime = memo["runtime"] = Runtime(OperatorSettings(), reconcile_job)
    assert isinstance(runtime, Runtime)
    return runtime


# compact copies for the indexes ---------------------------------------------------------------


def _pick(d: Any, *keys: str) -> dict[str, Any]:
    d = d or {}
    return {k: d[k] for k in keys if k in d and d[k] is not None}


def compact_pod(body: Any) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    containers = [
        {"name": container.get("name"), "resources": container.get("resources") or {}, **_heartbeat_env(container)}
        for container in spec.get("containers") or ()
    ]
    owners = [_pick(o, "uid", "controller") for o in meta.get("ownerReferences") or ()]
    # of the annotations only the node the placement chose (logic.gang.find_stale_placement) and
    # the GPUs a DRA claim holds (logic.topology.pod_gpus: the placement counts them on the node)
    planned = _pick(meta.get("annotations") or {}, NODE_ANNOTATION, CLAIMED_GPUS_ANNOTATION)
    # DRA: which claims the pod asks for from templates and which kube-controller-manager made
    # (logic/pending.py names a missing one, and the driver that should have made its template)
    claims = [_pick(c, "name", "resourceClaimTemplateName") for c in spec.get("resourceClaims") or ()
              if c.get("resourceClaimTemplateName")]
    made = [_pick(c, "name", "resourceClaimName") for c in status.get("resourceClaimStatuses") or ()]
    return {
        "metadata": {
            **_pick(meta, "name", "namespace", "uid", "deletionTimestamp", "creationTimestamp"),
            "labels": dict(meta.get("labels") or {}),
            **({"ownerReferences": owners} if owners else {}),
            **({"annotations": planned} if planned else {}),
        },
        "spec": {
            **_pick(spec, "nodeName", "schedulingGates", "schedulingGroup"),
            "containers": containers,
            **({"resourceClaims": claims} if claims else {}),
        },
        "status": {
            **_pick(status, "phase", "reason", "message", "conditions", "containerStatuses", "startTime"),
            **({"resourceClaimStatuses": made} if made else {}),
        },
    }


def _heartbeat_env(container: Any) -> dict[str, Any]:
    """Of a container's env only the heartbeat URL it was given: the address an operator
    restarted under the pod keeps (logic/health/address.py) and names when the pod is silent."""
    env = [_pick(e, "name", "value") for e in container.get("env") or () if e.get("name") == HEARTBEAT_URL_ENV]
    return {"env": env} if env else {}


def compact_node(body: Any) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {
        "metadata": {
            **_pick(meta, "name", "uid", "resourceVersion"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": _pick(body.get("spec") or {}, "taints", "unschedulable"),
        "status": _pick(body.get("status") or {}, "conditions", "allocatable", "capacity"),
    }


# indexes --------------------------------------------------------------------------------------
#
# The index and pod-event handlers are coroutines although none of them awaits anything: kopf
# runs a plain function in a thread of its executor, and handing each of the thousands of pod
# events of a starting gang to a thread and back cost ~15% of the operator's CPU (py-spy, issue
# 46); they do no I/O, so the event loop runs them at once. (The pod event's wake is also an
# asyncio.Event, which is set from the loop's own thread only.)


@kopf.index("pods", labels={JOB_LABEL: kopf.PRESENT})
async def railyard_job_pods(
    namespace: str | None, labels: Any, body: Any, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    return {(namespace or "", labels[JOB_LABEL]): compact_pod(body)}


@kopf.index("pods", field="spec.nodeName", value=kopf.PRESENT)
async def railyard_bound_pods(spec: Any, body: Any, **_: Any) -> dict[str, dict[str, Any]]:
    # Every bound pod of every watched namespace (all of them unless `--namespace` narrows the
    # operator: then GPUs held by other namespaces' pods are unseen, and only the scheduler's
    # refusals keep the placement off those nodes, logic/pending.py; docs/operator.md).
    # Finished ones too, with their latest phase: placement counts only pods that
    # are not Succeeded/Failed (logic.topology.compute_used_gpus). Returning None for a finished
    # pod would not drop it: kopf keeps an index's last value when a handler returns None, so
    # the pod would look Running, holding its GPUs, until deleted.
    return {spec["nodeName"]: compact_pod(body)}


@kopf.index("nodes")
async def railyard_nodes(name: str, body: Any, **_: Any) -> dict[str, dict[str, Any]]:
    return {name: compact_node(body)}


class NoDiffBase(kopf.DiffBaseStorage):
    """No "diff base": kopf builds one for every event of every watched object (a deep copy of
    the body, minus system fields) for change-detecting handlers (``on.create``/``update``/
    ``field``) to diff against. This operator registers none, only ``on.event`` handlers and
    indexes, so the copy was never read, yet it cost ~0.5 ms of CPU per pod event (a stored pod
    with its managedFields), the largest single cost of the operator's loop while a gang starts
    (py-spy, issue 46). tests/operator/test_kopf_keeps_no_diff_base.py fails if a change handler appears."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


# lifecycle ------------------------------------------------------------------------------------

#: No watch waits forever. The server ends each watch after WATCH_SERVER_TIMEOUT_S; the client
#: gives up on one that outlives that by WATCH_CLIENT_MARGIN_S (a connection that died without
#: closing); and one that delivers nothing, not even a bookmark, for WATCH_INACTIVITY_S (API
#: servers bookmark about once a minute, ours every 15 s) is reconnected by kopf from the last
#: resourceVersion, relisting on 410.
WATCH_SERVER_TIMEOUT_S = 300
WATCH_CLIENT_MARGIN_S = 30
WATCH_CONNECT_TIMEOUT_S = 10
WATCH_INACTIVITY_S = 70.0


def apply_watch_settings(settings: kopf.OperatorSettings) -> None:
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.client_timeout = WATCH_SERVER_TIMEOUT_S + WATCH_CLIENT_MARGIN_S
    settings.watching.connect_timeout = WATCH_CONNECT_TIMEOUT_S
    if hasattr(settings.watching, "inactivity_timeout"):  # kopf >= 1.44; before, client_timeout bounds it
        settings.watching.inactivity_timeout = WATCH_INACTIVITY_S



@kopf.on.login()
async def on_login_operator(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's client logs in with our connection: the same kubeconfig and ``--context`` (kopf's
    own login reads the current context only) and the same renewing credentials. kopf asks again
    when what it was given expired or was refused (401), so that one is dropped first."""
    runtime = runtime_of(memo)
    conn = runtime.connection()
    if runtime.kopf_credential is not None:
        conn.credentials.invalidate(runtime.kopf_credential)
    cred = await conn.credentials.current()
    runtime.kopf_credential = cred
    token = cred.token[7:] if cred.token and cred.token.lower().startswith("bearer ") else cred.token
    return kopf.ConnectionInfo(
        server=conn.server, ca_path=conn.ca_file, insecure=conn.insecure or None,
        scheme="Bearer" if token else None, token=token, username=cred.username, password=cred.password,
        certificate_path=cred.cert_file, private_key_path=cred.key_file,
        default_namespace=conn.namespace, expiration=cred.expires,
    )


@kopf.on.startup()
async def on_startup_operator(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    runtime = runtime_of(memo)
    settings.posting.enabled = False  # we write our own Events, one per transition
    settings.persistence.diffbase_storage = NoDiffBase()
    apply_watch_settings(settings)
    settings.networking.error_backoffs = [0.5, 1, 2, 5]
    runtime.api()
    if runtime.settings.metrics_port:
        from railyard.observe.control import add_control_routes
        from railyard.observe.heartbeats import add_heartbeat_routes
        from railyard.observe.metrics import build_http_app, start_http_server

        def routes(a: Any) -> None:
            add_heartbeat_routes(
                a,
                runtime.store,
                runtime.tokens,
                metrics=runtime.health_metrics,
                on_batch=runtime.checkpoint_metrics.observe_batch,
            )
            add_control_routes(a, runtime.control, runtime.tokens)

        app = build_http_app(
            runtime.metrics.registry,
            healthy=runtime.probes.liveness,
            ready=runtime.probes.readiness,
            extra_routes=routes,
        )
        runtime.http_runner = await start_http_server(app, runtime.settings.metrics_host, runtime.settings.metrics_port)
    runtime.probes.started = True


@kopf.on.cleanup()
async def on_cleanup_operator(memo: kopf.Memo, **_: Any) -> None:
    runtime = memo.get("runtime")
    if isinstance(runtime, Runtime):
        await runtime.close()


# events ---------------------------------------------------------------------------------------


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_event_trainingjob(
    event: Any, body: Any, name: str, namespace: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    runtime = runtime_of(memo)
    namespace = namespace or "default"
    runtime.bind_indexes(kwargs)
    if event.get("type") == "DELETED":
        await runtime.remove_job(namespace, name)
        # ownerReferences garbage-collect the rest; this covers API servers without a collector
        await KubeGangIO(runtime.api()).delete_owned(namespace, name)
        await delete_workload(KubeGangIO(runtime.api()), _plain(body), namespace, name)
        return
    runtime.upsert_job(namespace, name, _plain(body))


@kopf.on.event("pods", labels={JOB_LABEL: kopf.PRESENT})
async def on_event_pod(namespace: str | None, labels: Any, memo: kopf.Memo, **kwargs: Any) -> None:
    runtime = runtime_of(memo)
    runtime.bind_indexes(kwargs)
    runtime.wake(namespace or "", labels[JOB_LABEL])


@kopf.on.event("nodes")
async def on_event_node(event: Any, name: str, body: Any, memo: kopf.Memo, **kwargs: Any) -> None:
    runtime = runtime_of(memo)
    runtime.bind_indexes(kwargs)
    await on_node_change(
        runtime, KubeGangIO(runtime.api()), deleted=event.get("type") == "DELETED", name=name, body=body
    )


def _plain(body: Any) -> dict[str, Any]:
    import copy

    return copy.deepcopy(dict(body))
