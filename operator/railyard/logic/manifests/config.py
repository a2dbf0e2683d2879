"""What every pod of an attempt reads: the headless Service that names the pods, the heartbeat
Secret, and the attempt's ConfigMap (``config.json`` and the rank tables, with each pod's stable
address filled in).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from railyard.api.trainingjob import LighthousePlacement, TrainingJobSpec
from railyard.logic.intervals import resolve_checkpoint
from railyard.logic.layout import build_replica_group_table
from railyard.logic.manifests.names import (
    ATTEMPT_LABEL,
    CONFIG_FILE,
    JOB_LABEL,
    RANK_TABLE_FILE,
    RENDEZVOUS_PORT_BASE,
    TOKEN_KEY,
    configmap_name,
    group_rank_table_file,
    job_labels,
    object_meta,
    pod_address,
    rendezvous_port,
    secret_name,
    service_name,
)
from railyard.protocol.ranktable import PodEntry, RankTable
from railyard.protocol.trainerconfig import AttemptEnvelope, restart_wait_seconds, to_wire


def build_service(job: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """Headless, publishing not-ready addresses: rendezvous must resolve before pods are Ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(service_name(job), namespace, job_labels(job), owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: job},
            # Headless: DNS only, no proxying, so the per-attempt rendezvous port needs no entry.
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT_BASE, "protocol": "TCP"}],
        },
    }


def build_secret(job: str, namespace: str, owner: Mapping[str, Any], token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": object_meta(secret_name(job), namespace, job_labels(job), owner),
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def build_trainer_config(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    attempt: int,
    restore: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``config.json`` as the trainer reads it (railyard_trainer.config): the attempt's envelope
    (protocol's ``AttemptEnvelope``) around the spec's sections, the checkpoint intervals the spec
    leaves open filled in."""
    envelope = AttemptEnvelope(
        job=job, namespace=namespace, attempt=attempt, restore=None if restore is None else dict(restore),
        restart_wait_seconds=restart_wait_seconds(spec.restart_policy.in_place_timeout_seconds),
    )
    return {
        **to_wire(envelope, keep_none=True),
        "trainer": to_wire(spec.trainer),
        # with the data degree resolved
        "parallelism": {**to_wire(spec.parallelism, keep_none=True), "data": spec.data_parallel or None},
        # every interval the spec leaves open chosen by rule (logic/intervals.py)
        "checkpoint": to_wire(resolve_checkpoint(spec)),
        "health": to_wire(spec.health),
        # where the Lighthouse runs is the operator's alone (its pod, logic/manifests/lighthouse.py)
        "faultTolerance": {
            k: v
            for k, v in to_wire(replace(spec.fault_tolerance, lighthouse=LighthousePlacement())).items()
            if k != "lighthouse"
        },
    }


def build_configmap(
    job: str,
    namespace: str,
    owner: Mapping[str, Any],
    *,
    attempt: int,
    rank_table: RankTable,
    config: Mapping[str, Any],
    replica_groups: int = 1,
) -> dict[str, Any]:
    """The attempt's config and rank table. With ``replica_groups`` > 1 (faultTolerance
    ReplicaGroups) also one rank table per group (:func:`group_rank_table_file`), each its own
    world with its own rendezvous: what that group's pods read. The job's table stays (the
    operator's view of every rank)."""
    labels = {**job_labels(job), ATTEMPT_LABEL: str(attempt)}
    data = {
        RANK_TABLE_FILE: rank_table.to_json(),
        CONFIG_FILE: json.dumps(config, sort_keys=True, separators=(",", ":")),
    }
    if replica_groups > 1:
        for g in range(replica_groups):
            port = rendezvous_port(job, namespace, attempt, g)
            group_table = build_replica_group_table(rank_table, group=g, replicas=replica_groups, master_port=port)
            data[group_rank_table_file(g)] = group_table.to_json()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(configmap_name(job, attempt), namespace, labels, owner),
        "data": data,
    }


def with_addresses(table: RankTable, namespace: str) -> RankTable:
    """The rank table with each pod's stable DNS name and the rendezvous address filled in."""
    pods = tuple(
        PodEntry(p.pod_index, p.node, pod_address(table.job, namespace, p.pod_index), p.replica_peer)
        for p in table.pods
    )
    return RankTable(
        job=table.job, attempt=table.attempt, pp=table.pp, dp=table.dp, tp=table.tp,
        procs_per_node=table.procs_per_node, pods=pods, ranks=table.ranks,
        master_addr=pod_address(table.job, namespace, 0),
        master_port=rendezvous_port(table.job, namespace, table.attempt),
    )
