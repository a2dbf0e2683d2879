"""The Pod Security Standards (baseline and restricted), as the PodSecurity admission checks them.

Pure: :func:`check_pod` takes a level and a pod and returns the violations, each as the pair
(reason, detail) that kube-apiserver prints as ``reason (detail)``, in its order (checks sorted
by their ID; at ``restricted`` the restricted capability, seccomp and volume checks replace their
baseline ones). :func:`policy_of` reads a namespace's ``pod-security.kubernetes.io/*`` labels.
See https://kubernetes.io/docs/concepts/security/pod-security-standards/.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]

LEVELS = ("privileged", "baseline", "restricted")
LABEL = "pod-security.kubernetes.io/"

_BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
_SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
})
_RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim",
                       "projected", "secret")
_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
Violation = tuple[str, str]


@dataclass(frozen=True)
class Policy:
    """A namespace's levels: what is enforced (403), warned about and audited."""

    enforce: tuple[str, str] = ("privileged", "latest")
    warn: tuple[str, str] = ("privileged", "latest")
    audit: tuple[str, str] = ("privileged", "latest")


def _level(labels: dict[str, str], mode: str) -> tuple[str, str]:
    level = labels.get(LABEL + mode, "privileged")
    if level not in LEVELS:
        level = "restricted"  # an invalid level is treated as the strictest, as upstream
    return level, labels.get(LABEL + mode + "-version", "latest") or "latest"


def policy_of(namespace_labels: dict[str, str] | None) -> Policy:
    labels = namespace_labels or {}
    return Policy(_level(labels, "enforce"), _level(labels, "warn"), _level(labels, "audit"))


def _quoted(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _containers(pod: JSON) -> Iterator[JSON]:
    spec = pod.get("spec") or {}
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, dict):
                yield c


def _sc(c: JSON) -> JSON:
    sc = c.get("securityContext")
    return sc if isinstance(sc, dict) else {}


def _pod_sc(pod: JSON) -> JSON:
    sc = (pod.get("spec") or {}).get("securityContext")
    return sc if isinstance(sc, dict) else {}


def _containers_phrase(names: list[str], singular: str, plural: str) -> str:
    return (
        f"{'container' if len(names) == 1 else 'containers'} {_quoted(names)} {singular if len(names) == 1 else plural}"
    )


# ---- the checks, by ID --------------------------------------------------------------------------


def _allow_privilege_escalation(pod: JSON) -> list[Violation]:
    bad = [c.get("name", "") for c in _containers(pod) if _sc(c).get("allowPrivilegeEscalation") is not False]
    if not bad:
        return []
    return [("allowPrivilegeEscalation != false",
             _containers_phrase(bad, "must set", "must set") + " securityContext.allowPrivilegeEscalation=false")]


def _app_armor(pod: JSON) -> list[Violation]:
    bad: list[str] = []
    profile = (_pod_sc(pod).get("appArmorProfile") or {}).get("type")
    if profile == "Unconfined":
        bad.append('pod must not set securityContext.appArmorProfile.type to "Unconfined"')
    names = [c.get("name", "") for c in _containers(pod)
             if (_sc(c).get("appArmorProfile") or {}).get("type") == "Unconfined"]
    if names:
        bad.append(_containers_phrase(names, "must not set", "must not set")
                   + ' securityContext.appArmorProfile.type to "Unconfined"')
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    for k, v in sorted(annotations.items()):
        if k.startswith("container.apparmor.security.beta.kubernetes.io/") and v not in ("runtime/default", "") \
                and not str(v).startswith("localhost/"):
            bad.append(f'{k}="{v}"')
    return [("forbidden AppArmor profile", ", ".join(bad))] if bad else []


def _capabilities_baseline(pod: JSON) -> list[Violation]:
    out: list[str] = []
    for c in _containers(pod):
        added = [a for a in (_sc(c).get("capabilities") or {}).get("add") or [] if a not in _BASELINE_CAPABILITIES]
        if added:
            out.append(f'container "{c.get("name", "")}" must not include {_quoted(added)} in '
                       "securityContext.capabilities.add")
    return [("non-default capabilities", ", ".join(out))] if out else []


def _capabilities_restricted(pod: JSON) -> list[Violation]:
    no_drop: list[str] = []
    adds: list[str] = []
    for c in _containers(pod):
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            no_drop.append(c.get("name", ""))
        added = [a for a in caps.get("add") or [] if a != "NET_BIND_SERVICE"]
        if added:
            adds.append(f'container "{c.get("name", "")}" must not include {_quoted(added)} in '
                        "securityContext.capabilities.add")
    details = []
    if no_drop:
        details.append(
            _containers_phrase(no_drop, "must set", "must set") + ' securityContext.capabilities.drop=["ALL"]'
        )
    details.extend(adds)
    return [("unrestricted capabilities", "; ".join(details))] if details else []


def _host_namespaces(pod: JSON) -> list[Violation]:
    spec = pod.get("spec") or {}
    bad = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k) is True]
    return [("host namespaces", ", ".join(bad))] if bad else []


def _host_path_volumes(pod: JSON) -> list[Violation]:
    names = [v.get("name", "") for v in (pod.get("spec") or {}).get("volumes") or []
             if isinstance(v, dict) and "hostPath" in v]
    if not names:
        return []
    return [("hostPath volumes", f'{"volume" if len(names) == 1 else "volumes"} {_quoted(names)}')]


def _host_ports(pod: JSON) -> list[Violation]:
    names: list[str] = []
    ports: list[str] = []
    for c in _containers(pod):
        used = [str(p["hostPort"]) for p in c.get("ports") or [] if isinstance(p, dict) and p.get("hostPort")]
        if used:
            names.append(c.get("name", ""))
            ports.extend(used)
    if not names:
        return []
    return [("hostPort", f'{_containers_phrase(names, "uses", "use")} {"hostPort" if len(ports) == 1 else "hostPorts"} '
             + ", ".join(ports))]


def _host_process(pod: JSON) -> list[Violation]:
    pod_hp = (_pod_sc(pod).get("windowsOptions") or {}).get("hostProcess") is True
    names = [
        c.get("name", "") for c in _containers(pod) if (_sc(c).get("windowsOptions") or {}).get("hostProcess") is True
    ]
    if not pod_hp and not names:
        return []
    who = "pod" if pod_hp and not names else ("pod and " if pod_hp else "") + _containers_phrase(names, "", "").strip()
    return [("hostProcess", f"{who} must not set securityContext.windowsOptions.hostProcess=true")]


def _privileged(pod: JSON) -> list[Violation]:
    names = [c.get("name", "") for c in _containers(pod) if _sc(c).get("privileged") is True]
    if not names:
        return []
    return [
        ("privileged", _containers_phrase(names, "must not set", "must not set") + " securityContext.privileged=true")
    ]


def _proc_mount(pod: JSON) -> list[Violation]:
    names = [c.get("name", "") for c in _containers(pod) if _sc(c).get("procMount") not in (None, "Default")]
    if not names:
        return []
    return [("procMount", _containers_phrase(names, "must not set", "must not set") + " securityContext.procMount")]


def _restricted_volumes(pod: JSON) -> list[Violation]:
    names: list[str] = []
    kinds: list[str] = []
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(v, dict):
            continue
        types = [k for k in v if k != "name"]
        bad = [t for t in types if t not in _RESTRICTED_VOLUMES]
        if bad:
            names.append(v.get("name", ""))
            kinds.extend(t for t in bad if t not in kinds)
    if not names:
        return []
    one = len(names) == 1
    return [("restricted volume types", f'{"volume" if one else "volumes"} {_quoted(names)} {"uses" if one else "use"} '
             f'{"restricted volume type" if len(kinds) == 1 else "restricted volume types"} {_quoted(kinds)}')]


def _run_as_non_root(pod: JSON) -> list[Violation]:
    pod_value = _pod_sc(pod).get("runAsNonRoot")
    explicit_false: list[str] = []
    unset: list[str] = []
    for c in _containers(pod):
        v = _sc(c).get("runAsNonRoot")
        if v is False:
            explicit_false.append(c.get("name", ""))
        elif v is None and pod_value is not True:
            unset.append(c.get("name", ""))
    details = []
    if pod_value is False:
        details.append("pod must not set securityContext.runAsNonRoot=false")
    if explicit_false:
        details.append(_containers_phrase(explicit_false, "must not set", "must not set") +
                       " securityContext.runAsNonRoot=false")
    if unset and pod_value is not False:
        details.append(f'pod or {_containers_phrase(unset, "must set", "must set")} securityContext.runAsNonRoot=true')
    return [("runAsNonRoot != true", "; ".join(details))] if details else []


def _run_as_user(pod: JSON) -> list[Violation]:
    details = []
    if _pod_sc(pod).get("runAsUser") == 0:
        details.append("pod must not set runAsUser=0")
    names = [c.get("name", "") for c in _containers(pod) if _sc(c).get("runAsUser") == 0]
    if names:
        details.append(_containers_phrase(names, "must not set", "must not set") + " runAsUser=0")
    return [("runAsUser=0", "; ".join(details))] if details else []


def _se_linux(pod: JSON) -> list[Violation]:
    bad = []
    for who, sc in [("pod", _pod_sc(pod))] + [(f'container "{c.get("name", "")}"', _sc(c)) for c in _containers(pod)]:
        opts = sc.get("seLinuxOptions") or {}
        if opts.get("type", "") not in _SELINUX_TYPES or opts.get("user") or opts.get("role"):
            bad.append(who)
    if not bad:
        return []
    return [("seLinuxOptions", ", ".join(bad) + " set forbidden securityContext.seLinuxOptions")]


def _seccomp_baseline(pod: JSON) -> list[Violation]:
    details = []
    if (_pod_sc(pod).get("seccompProfile") or {}).get("type") == "Unconfined":
        details.append('pod must not set securityContext.seccompProfile.type to "Unconfined"')
    names = [
        c.get("name", "") for c in _containers(pod) if (_sc(c).get("seccompProfile") or {}).get("type") == "Unconfined"
    ]
    if names:
        details.append(_containers_phrase(names, "must not set", "must not set")
                       + ' securityContext.seccompProfile.type to "Unconfined"')
    return [("seccompProfile", "; ".join(details))] if details else []


def _seccomp_restricted(pod: JSON) -> list[Violation]:
    ok = ("RuntimeDefault", "Localhost")
    pod_type = (_pod_sc(pod).get("seccompProfile") or {}).get("type")
    details = []
    if pod_type is not None and pod_type not in ok:
        details.append(f'pod must not set securityContext.seccompProfile.type to "{pod_type}"')
    bad_set = [c.get("name", "") for c in _containers(pod)
               if (_sc(c).get("seccompProfile") or {}).get("type") not in (None, *ok)]
    unset = [c.get("name", "") for c in _containers(pod) if (_sc(c).get("seccompProfile") or {}).get("type") is None]
    if bad_set:
        details.append(_containers_phrase(bad_set, "must not set", "must not set")
                       + ' securityContext.seccompProfile.type to "Unconfined"')
    if unset and pod_type not in ok:
        if pod_type is None:
            details.append(f'pod or {_containers_phrase(unset, "must set", "must set")} '
                           'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
        else:
            details.append(f'{_containers_phrase(unset, "must set", "must set")} '
                           'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
    return [("seccompProfile", "; ".join(details))] if details else []


def _sysctls(pod: JSON) -> list[Violation]:
    bad = [s.get("name", "") for s in _pod_sc(pod).get("sysctls") or [] if s.get("name") not in _SAFE_SYSCTLS]
    return [("forbidden sysctls", ", ".join(bad))] if bad else []


Check = Callable[[JSON], list[Violation]]
#: (ID, lowest level it applies at, the check), sorted by ID as upstream; a restricted check
#: replaces the baseline check it names.
_CHECKS: list[tuple[str, str, Check, str | None]] = [
    ("allowPrivilegeEscalation", "restricted", _allow_privilege_escalation, None),
    ("appArmorProfile", "baseline", _app_armor, None),
    ("capabilities_baseline", "baseline", _capabilities_baseline, None),
    ("capabilities_restricted", "restricted", _capabilities_restricted, "capabilities_baseline"),
    ("hostNamespaces", "baseline", _host_namespaces, None),
    ("hostPathVolumes", "baseline", _host_path_volumes, None),
    ("hostPorts", "baseline", _host_ports, None),
    ("hostProcess", "baseline", _host_process, None),
    ("privileged", "baseline", _privileged, None),
    ("procMount", "baseline", _proc_mount, None),
    ("restrictedVolumes", "restricted", _restricted_volumes, "hostPathVolumes"),
    ("runAsNonRoot", "restricted", _run_as_non_root, None),
    ("runAsUser", "restricted", _run_as_user, None),
    ("seLinuxOptions", "baseline", _se_linux, None),
    ("seccompProfile_baseline", "baseline", _seccomp_baseline, None),
    ("seccompProfile_restricted", "restricted", _seccomp_restricted, "seccompProfile_baseline"),
    ("sysctls", "baseline", _sysctls, None),
]


def check_pod(level: str, pod: JSON) -> list[Violation]:
    """Everything ``pod`` does that ``level`` forbids (nothing at ``privileged``)."""
    if level not in LEVELS or level == "privileged":
        return []
    rank = LEVELS.index(level)
    active = [c for c in _CHECKS if LEVELS.index(c[1]) <= rank]
    replaced = {c[3] for c in active if c[3] is not None}
    out: list[Violation] = []
    for check_id, _, fn, _ in active:
        if check_id not in replaced:
            out.extend(fn(pod))
    return out


def describe(level: str, version: str, violations: list[Violation]) -> str:
    """``violates PodSecurity "baseline:latest": hostPath volumes (volume "y"), ...``."""
    return f'PodSecurity "{level}:{version}": ' + ", ".join(f"{r} ({d})" for r, d in violations)
