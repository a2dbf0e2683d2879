"""What the benchmarks that run TrainingJobs on the local cluster share: the job's API path, its
status, and a bounded wait on a condition of it that stops at once when the job fails."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from railyard.k8s.client import Kube


def jobs_path(namespace: str, name: str = "") -> str:
    """The TrainingJobs of ``namespace``, or one of them."""
    return f"/apis/railyard.dev/v1alpha1/namespaces/{namespace}/trainingjobs" + (f"/{name}" if name else "")


async def job_status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    obj = await kube.get(jobs_path(namespace, name)) or {}
    return dict(obj.get("status") or {})


async def wait_job(kube: Kube, namespace: str, name: str, what: str, pred: Callable[[dict[str, Any]], Any],
                   timeout: float, *, poll_s: float = 0.2) -> dict[str, Any]:
    """The job's status once ``pred`` holds; a failed job or ``timeout`` ends the wait with the status."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = await job_status(kube, namespace, name)
        if pred(s):
            return s
        if s.get("phase") == "Failed":
            raise RuntimeError(f"{name}: job failed while waiting for {what}: {json.dumps(s)[:2000]}")
        await asyncio.sleep(poll_s)
    raise TimeoutError(
        f"{name}: {what} not within {timeout:.0f} s: {json.dumps(await job_status(kube, namespace, name))[:2000]}"
    )
