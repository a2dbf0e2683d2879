"""The operator pod meets the Kubernetes "restricted" Pod Security Standard; training pods are
checked too, and the fields that must deviate (hostPath checkpoint tiers) are reported.

The checks follow https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline
+ restricted, as of v1.32).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from .chart import PRODUCTION_VALUES, ROOT, find, load_values, render_objects, validate

ALLOWED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}


def restricted_violations(pod_spec: dict[str, Any], annotations: dict[str, str] | None = None) -> list[str]:
    """Every way ``pod_spec`` breaks the restricted profile (empty: compliant)."""
    v: list[str] = []
    psc = pod_spec.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(host):
            v.append(f"spec.{host}: must be unset or false")
    for vol in pod_spec.get("volumes") or []:
        kinds = set(vol) - {"name"}
        for kind in kinds - ALLOWED_VOLUME_TYPES:
            v.append(f"spec.volumes[{vol['name']}]: volume type {kind} not allowed")
    if (psc.get("seLinuxOptions") or {}).get("type") not in (None, "", "container_t", "container_init_t", "container_kvm_t"):
        v.append("spec.securityContext.seLinuxOptions.type: not allowed")
    for key, val in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and val not in ("runtime/default",) and not val.startswith("localhost/"):
            v.append(f"annotation {key}: AppArmor profile {val} not allowed")
    if psc.get("sysctls"):
        safe = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
        for s in psc["sysctls"]:
            if s["name"] not in safe:
                v.append(f"spec.securityContext.sysctls: {s['name']} not allowed")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        v.append("spec.securityContext.seccompProfile.type: must be RuntimeDefault or Localhost")
    if psc.get("runAsUser") == 0:
        v.append("spec.securityContext.runAsUser: must not be 0")
    containers = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or []),
                  *(pod_spec.get("ephemeralContainers") or [])]
    for c in containers:
        where = f"container {c['name']}"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            v.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            v.append(f"{where}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            v.append(f"{where}: capabilities.drop must include ALL")
        for add in set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            v.append(f"{where}: capability {add} may not be added")
        run_as_non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if run_as_non_root is not True:
            v.append(f"{where}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser") == 0:
            v.append(f"{where}: runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            v.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost (pod or container)")
        if sc.get("procMount") not in (None, "Default"):
            v.append(f"{where}: procMount must be Default")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                v.append(f"{where}: hostPort {p['hostPort']} not allowed")
    return v


def test_the_checker_catches_each_violation() -> None:
    bad = {
        "hostNetwork": True,
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        "securityContext": {"seccompProfile": {"type": "Unconfined"}},
        "containers": [{
            "name": "c",
            "ports": [{"containerPort": 80, "hostPort": 80}],
            "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}, "runAsUser": 0},
        }],
    }
    text = "\n".join(restricted_violations(bad))
    for needle in ("hostNetwork", "hostPath", "seccompProfile", "privileged", "allowPrivilegeEscalation",
                   "drop must include ALL", "SYS_ADMIN", "runAsNonRoot", "runAsUser", "hostPort"):
        assert needle in text, needle


@pytest.mark.parametrize("values", [{}, load_values(PRODUCTION_VALUES)], ids=["default", "production"])
def test_operator_pod_is_restricted(values: dict[str, Any]) -> None:
    dep = find(render_objects(values), "Deployment")
    tmpl = dep["spec"]["template"]
    assert restricted_violations(tmpl["spec"], tmpl["metadata"].get("annotations")) == []
    c = tmpl["spec"]["containers"][0]
    # beyond the profile: a read-only root filesystem and resources
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    # liveness (and start-up) on /healthz, readiness on /readyz: two different facts
    paths = {probe: c[probe]["httpGet"]["path"] for probe in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert paths == {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}


def build_training_pods(**spec_overrides: Any) -> list[dict[str, Any]]:
    """The pods the operator builds for examples/tiny-cpu.yaml (with overrides)."""
    from railyard.api.trainingjob import TrainingJobSpec
    from railyard.logic.manifests import build_gang_pods, owner_reference

    job = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    job["metadata"].update(namespace="ml", uid="u-1")
    spec = TrainingJobSpec.model_validate({**job["spec"], **spec_overrides})
    return build_gang_pods(
        spec, job="tiny", namespace="ml", owner=owner_reference(job), attempt=0,
        nodes=[f"n{i}" for i in range(spec.nodes)], heartbeat_url="http://railyard.railyard-system.svc:8080",
    )


#: What the init container that hands the hostPath folders to the trainer's UID needs (root with
#: CAP_CHOWN only; reported in docs/deploy.md). Only pods of the default image have it.
CHOWN_INIT = [
    "container checkpoint-dirs: capability CHOWN may not be added",
    "container checkpoint-dirs: runAsNonRoot must be true (pod or container)",
    "container checkpoint-dirs: runAsUser must not be 0",
]


def test_training_pods_deviate_only_by_their_hostpath_checkpoint_tiers() -> None:
    """Reported in docs/deploy.md: tier 1 (node RAM, /dev/shm-backed) and tier 2 (node-local disk)
    must survive the pod, so they are hostPath volumes (and, for the default image, a root init
    container makes them the trainer UID's); everything else is restricted-clean."""
    pods = build_training_pods()
    for pod in pods:
        assert validate(pod) == []
        deviations = restricted_violations(pod["spec"])
        assert sorted(deviations) == [
            *CHOWN_INIT,
            "spec.volumes[ckpt-local]: volume type hostPath not allowed",
            "spec.volumes[ckpt-memory]: volume type hostPath not allowed",
            "spec.volumes[ckpt-shared]: volume type hostPath not allowed",
        ]
    # the main container itself is restricted-clean
    main_only = {**pods[0]["spec"], "initContainers": []}
    assert not [d for d in restricted_violations(main_only) if d.startswith("container")]


def test_a_custom_image_is_as_restricted_as_ours_unless_it_asks_for_root() -> None:
    # our image under another name, or one built FROM it: the same user and the same deviations
    pods = build_training_pods(image="registry.example/trainer:1.2.3")
    assert pods[0]["spec"]["securityContext"]["runAsUser"] == 10001
    assert sorted(restricted_violations(pods[0]["spec"])) == sorted(restricted_violations(build_training_pods()[0]["spec"]))
    # an image that must run as root says so: no chown init container, and restricted says no
    root = build_training_pods(image="registry.example/trainer:1.2.3", securityContext={"runAsUser": 0})[0]["spec"]
    assert "initContainers" not in root and root["securityContext"]["runAsUser"] == 0
    assert any("runAsNonRoot" in v for v in restricted_violations(root)), restricted_violations(root)


def test_a_shared_tier_on_a_claim_leaves_only_the_node_tiers() -> None:
    pods = build_training_pods(checkpoint={"shared": {"intervalSteps": 30, "claimName": "ckpt"}})
    assert sorted(restricted_violations(pods[0]["spec"])) == [
        *CHOWN_INIT,
        "spec.volumes[ckpt-local]: volume type hostPath not allowed",
        "spec.volumes[ckpt-memory]: volume type hostPath not allowed",
    ]


def test_the_memory_tier_in_the_pod_makes_training_pods_restricted_clean() -> None:
    """``checkpoint.memory.medium: Pod`` (an emptyDir of medium Memory, kept by in-place
    restarts), the local tier off and the shared tier on a claim: no hostPath, no root init
    container, so the pods pass restricted (and with it baseline)."""
    pods = build_training_pods(checkpoint={"memory": {"medium": "Pod", "sizeLimit": "2Gi"}, "local": {"enabled": False},
                                           "shared": {"intervalSteps": 30, "claimName": "ckpt"}})
    for pod in pods:
        assert validate(pod) == []
        assert restricted_violations(pod["spec"]) == []
        vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "ckpt-memory")
        assert vol == {"name": "ckpt-memory", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}


def test_hot_spare_placeholders_are_restricted_clean() -> None:
    from railyard.api.trainingjob import TrainingJobSpec
    from railyard.logic.manifests import build_spare_pod, owner_reference

    job = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    job["metadata"].update(namespace="ml", uid="u-1")
    for image in (None, "registry.example/trainer:1.2.3"):
        spec = TrainingJobSpec.model_validate({**job["spec"], **({"image": image} if image else {})})
        pod = build_spare_pod(spec, job="tiny", namespace="ml", owner=owner_reference(job), node="n9")
        assert validate(pod) == []
        assert restricted_violations(pod["spec"]) == []
