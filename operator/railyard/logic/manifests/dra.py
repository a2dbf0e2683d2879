"""GPUs by Dynamic Resource Allocation (``spec.gpuClaim``): the job's ResourceClaimTemplate and
ComputeDomain, and the claims each gang pod or placeholder names.

A template's spec cannot change, so its name carries a hash of the request: a spec edit makes a new
one for the next attempt's pods, and the old one goes with the job.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests.names import job_labels, object_meta
from railyard.logic.topology import CLAIMED_GPUS_ANNOTATION

RESOURCE_API_VERSION = "resource.k8s.io/v1"

#: NVIDIA's DRA driver: the ComputeDomain CRD, and the DeviceClass of its IMEX channels.
COMPUTE_DOMAIN_API_VERSION = "resource.nvidia.com/v1beta1"
COMPUTE_DOMAIN_PLURAL = "computedomains"
RESOURCE_CLAIM_TEMPLATE_PLURAL = "resourceclaimtemplates"

#: The pod's claim names (``spec.resourceClaims[].name``, ``resources.claims[].name``).
GPU_CLAIM = "gpus"
CHANNEL_CLAIM = "channel"


def _gpu_request(spec: TrainingJobSpec) -> dict[str, Any]:
    claim = spec.gpu_claim
    device_class = claim.device_class_name if claim is not None else ""
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": spec.claimed_gpus}
    return {"name": GPU_CLAIM, "exactly": exactly}


def gpu_claim_template_name(spec: TrainingJobSpec, job: str) -> str:
    """``<job>-gpus-<hash of the request>``: a template's spec cannot change, so a spec edit of the
    count or the class (taking effect at the next restart) makes a new one, which the new pods
    name; the old one goes with the job."""
    digest = zlib.crc32(json.dumps(_gpu_request(spec), sort_keys=True).encode())
    return f"{job}-gpus-{digest:08x}"


def compute_domain_name(spec: TrainingJobSpec, job: str) -> str:
    """``<job>-nvlink-<nodes>``: one ComputeDomain per gang size (``numNodes``), for the same
    reason as :func:`gpu_claim_template_name`."""
    return f"{job}-nvlink-{spec.nodes}"


def channel_claim_template_name(spec: TrainingJobSpec, job: str) -> str:
    """The ResourceClaimTemplate NVIDIA's driver creates for the ComputeDomain's IMEX channel
    (the name is ours: ``spec.channel.resourceClaimTemplate.name``)."""
    return f"{compute_domain_name(spec, job)}-channel"


def pod_resource_claims(spec: TrainingJobSpec, job: str) -> list[dict[str, str]]:
    """``spec.resourceClaims`` of a gang pod or placeholder: one claim per pod from the job's GPU
    template and, with a ComputeDomain, from its channel template; empty without gpuClaim."""
    claim = spec.gpu_claim
    if claim is None or spec.claimed_gpus == 0:
        return []
    out = [{"name": GPU_CLAIM, "resourceClaimTemplateName": gpu_claim_template_name(spec, job)}]
    if claim.compute_domain:
        out.append({"name": CHANNEL_CLAIM, "resourceClaimTemplateName": channel_claim_template_name(spec, job)})
    return out


def build_gpu_claim_template(
    spec: TrainingJobSpec, *, job: str, namespace: str, owner: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The job's ResourceClaimTemplate: ``spec.gpus`` devices of ``gpuClaim.deviceClassName``
    per pod (allocationMode ExactCount); None without gpuClaim. Owned by the job."""
    claim = spec.gpu_claim
    if claim is None or spec.claimed_gpus == 0:
        return None
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": object_meta(gpu_claim_template_name(spec, job), namespace, job_labels(job), owner),
        "spec": {"metadata": {"labels": job_labels(job)}, "spec": {"devices": {"requests": [_gpu_request(spec)]}}},
    }


def build_compute_domain(
    spec: TrainingJobSpec, *, job: str, namespace: str, owner: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The job's ComputeDomain (``gpuClaim.computeDomain``): one IMEX domain over the gang's
    ``spec.nodes`` nodes, whose channel template the pods claim from; None otherwise. Owned by
    the job, so it goes with it."""
    claim = spec.gpu_claim
    if claim is None or not claim.compute_domain or spec.claimed_gpus == 0:
        return None
    return {
        "apiVersion": COMPUTE_DOMAIN_API_VERSION,
        "kind": "ComputeDomain",
        "metadata": object_meta(compute_domain_name(spec, job), namespace, job_labels(job), owner),
        "spec": {
            "numNodes": spec.nodes,
            "channel": {"resourceClaimTemplate": {"name": channel_claim_template_name(spec, job)}},
        },
    }


def build_dra_objects(
    spec: TrainingJobSpec, *, job: str, namespace: str, owner: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The per-job DRA objects, in creation order (before any pod): the GPU claim template, then
    the ComputeDomain; empty without gpuClaim."""
    built = (
        build_gpu_claim_template(spec, job=job, namespace=namespace, owner=owner),
        build_compute_domain(spec, job=job, namespace=namespace, owner=owner),
    )
    return [o for o in built if o is not None]


def add_pod_claims(spec: TrainingJobSpec, job: str, pod_spec: dict[str, Any], meta: dict[str, Any]) -> None:
    """Give a pod (gang member or placeholder) its DRA claims and the annotation placement
    counts them by."""
    claims = pod_resource_claims(spec, job)
    if claims:
        pod_spec["resourceClaims"] = claims
        meta["annotations"][CLAIMED_GPUS_ANNOTATION] = str(spec.claimed_gpus)
