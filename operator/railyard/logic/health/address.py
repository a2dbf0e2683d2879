"""Where a job's pods reach the operator: the base URL of its heartbeat ingest and control channel.

Pods get ``RAILYARD_HEARTBEAT_URL=<base>/v1/heartbeats/<ns>/<job>`` (and the control URL beside
it, logic/manifests/pod.py) when they are created, and keep it for their life. So the base a job's
pods carry is a fact an operator restarted under them must not change by accident (issue 35):

1. an advertised base (``--heartbeat-advertise-url``, or the local cluster's published
   address: commands/operator.py) wins: whoever set it knows where the operator listens;
2. else the base the job's pods already carry, learned from them once and kept for the job;
3. else the in-cluster Service of the Helm chart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from railyard.logic.gang import attempt_of
from railyard.protocol import podenv

#: The pod env var that carries the heartbeat URL (the pod contract, docs/trainer.md).
HEARTBEAT_URL_ENV = podenv.HEARTBEAT_URL.name
HEARTBEAT_ROUTE = "/v1/heartbeats/{namespace}/{job}"


def default_heartbeat_base(metrics_port: int) -> str:
    """The Helm chart's Service in front of the operator's HTTP port."""
    return f"http://railyard-operator.railyard-system.svc:{metrics_port}"


def build_heartbeat_url(base: str, namespace: str, job: str) -> str:
    return base.rstrip("/") + HEARTBEAT_ROUTE.format(namespace=namespace, job=job)


def heartbeat_base_of(url: str, namespace: str, job: str) -> str:
    """``http://h:1/v1/heartbeats/ns/job`` -> ``http://h:1``; a URL of another shape (a user's
    own ``spec.env`` override) is kept whole."""
    suffix = HEARTBEAT_ROUTE.format(namespace=namespace, job=job)
    return url[: -len(suffix)] if url.endswith(suffix) else url.rstrip("/")


def heartbeat_url_of(pod: Mapping[str, Any]) -> str:
    """The heartbeat URL a pod was given ("" when none of its containers has one)."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        for e in container.get("env") or ():
            if e.get("name") == HEARTBEAT_URL_ENV and e.get("value"):
                return str(e["value"])
    return ""


def carried_heartbeat_base(pods: Iterable[Mapping[str, Any]], namespace: str, job: str) -> str:
    """The base the job's pods carry (the newest attempt's first pod that has one; "" when none)."""
    for pod in sorted(pods, key=attempt_of, reverse=True):
        url = heartbeat_url_of(pod)
        if url:
            return heartbeat_base_of(url, namespace, job)
    return ""


def decide_heartbeat_base(*, advertised: str, carried: str, metrics_port: int) -> str:
    """The base for a job's new pods (module docstring: advertised, carried, the Service)."""
    return advertised or carried or default_heartbeat_base(metrics_port)
