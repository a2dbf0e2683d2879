"""The rules of Kubernetes' core API that Railyard relies on, written once.

- **Tolerations and taints** (kube's ``ToleratesTaint``): used by placement
  (:mod:`railyard.logic.topology`) and the local cluster's scheduler
  (:mod:`railyard_local.scheduling`), so both keep a pod off the same nodes.
- **Node readiness** (the ``Ready`` condition): placement, failure classification, pod
  deletion, the kopf handlers and the local scheduler.
- **Node selection** (``nodeSelector``, required node-affinity terms, and the equality selector a
  Service has): placement (``spec.nodeSelector``), the gang check and the local cluster's
  scheduler and node agent (its hosts file) match with the same functions.
- **What the pods' API checks** in the fields a TrainingJob passes through to its pods (label
  keys and values, DNS names, environment variable names, container resources): the models
  (hence ``railyard validate`` and the operator) apply these functions, and the CRD carries the
  same rules as schema patterns, so a spec the pod create would refuse is refused at apply time.

Pure, standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from railyard.api.quantity import QuantityError, parse_quantity, to_milli

# --------------------------------------------------------------------------- names

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
#: RFC 1123 subdomain (object names such as ServiceAccount, PriorityClass, PVC), <= 253.
DNS_SUBDOMAIN_PATTERN = rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$"
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
#: A label key or other qualified name: ``[prefix/]name``, prefix a DNS subdomain (<= 253), name
#: <= 63 characters.
QUALIFIED_NAME_PATTERN = rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?{_QUALIFIED_NAME}$"
#: A label value: empty, or <= 63 characters of alphanumerics, '-', '_', '.' that start and end
#: alphanumeric.
LABEL_VALUE_PATTERN = rf"^({_QUALIFIED_NAME})?$"
#: Environment variable names as v1.34+ API servers accept them (RelaxedEnvironmentVariable
#: Validation): printable ASCII except '='. Older servers want ``[-._a-zA-Z][-._a-zA-Z0-9]*``.
ENV_VAR_NAME_PATTERN = r"^[ -<>-~]+$"

_DNS_SUBDOMAIN_RE = re.compile(DNS_SUBDOMAIN_PATTERN)
_QUALIFIED_NAME_RE = re.compile(rf"^{_QUALIFIED_NAME}$")
_LABEL_VALUE_RE = re.compile(LABEL_VALUE_PATTERN)
_ENV_VAR_NAME_RE = re.compile(ENV_VAR_NAME_PATTERN)


def check_dns_subdomain(value: str) -> str | None:
    """None when ``value`` is a valid object name (RFC 1123 subdomain), else the problem."""
    if len(value) > 253:
        return f"{value[:40]!r}...: must be no more than 253 characters"
    if not _DNS_SUBDOMAIN_RE.match(value):
        return (
            f"{value!r}: must be lowercase alphanumerics, '-' or '.', starting and ending alphanumeric (e.g. 'my-name')"
        )
    return None


def check_qualified_name(value: str) -> str | None:
    """None when ``value`` is a valid label key (``[prefix/]name``), else the problem."""
    prefix, slash, name = value.rpartition("/")
    if slash and not prefix:
        return f"{value!r}: the prefix before '/' must not be empty"
    if slash and check_dns_subdomain(prefix) is not None:
        return f"{value!r}: the prefix {prefix!r} must be a DNS subdomain (e.g. 'example.com')"
    if not name:
        return f"{value!r}: the name part must not be empty"
    if len(name) > 63:
        return f"{value!r}: the name part must be no more than 63 characters"
    if not _QUALIFIED_NAME_RE.match(name):
        return (
                   f"{value!r}: must be alphanumerics, '-', '_' or '.', starting and ending alphanumeric, with an "
                   "optional DNS prefix (e.g. 'example.com/my-key')"
               )
    return None


def check_label_value(value: str) -> str | None:
    """None when ``value`` is a valid label value, else the problem."""
    if len(value) > 63:
        return f"{value[:40]!r}...: a label value must be no more than 63 characters"
    if not _LABEL_VALUE_RE.match(value):
        return (
                   f"{value!r}: a label value must be empty or alphanumerics, '-', '_' or '.', starting and ending "
                   "alphanumeric"
               )
    return None


def check_env_var_name(value: str) -> str | None:
    """None when ``value`` is an environment variable name the pods' API accepts."""
    if not _ENV_VAR_NAME_RE.match(value):
        return (
            f"{value!r}: an environment variable name must be printable ASCII characters other than '=' (e.g. 'MY_VAR')"
        )
    return None


# --------------------------------------------------------------------------- resources

#: Resources a container may request that need no domain prefix.
STANDARD_CONTAINER_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


def is_extended_resource(name: str) -> bool:
    """A resource advertised by a device plugin or an operator (``nvidia.com/gpu``): it has a
    domain prefix outside ``kubernetes.io`` and is not ``requests.*`` quota syntax."""
    prefix, slash, _ = name.partition("/")
    if not slash:
        return False
    return not (prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io") or name.startswith("requests."))


def check_resource_name(name: str) -> str | None:
    """None when a container may request ``name`` (kube's validateContainerResourceName)."""
    problem = check_qualified_name(name)
    if problem is not None:
        return problem
    if name in STANDARD_CONTAINER_RESOURCES or name.startswith("hugepages-") or is_extended_resource(name):
        return None
    return (
               f"{name!r}: must be cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource with a "
               "domain "
               "(e.g. nvidia.com/gpu)"
           )


def check_resource_requirements(requests: Mapping[str, str], limits: Mapping[str, str]) -> list[tuple[str, str]]:
    """Every problem the pods' API would find in a container's resources, as (field, message)
    pairs with fields relative to ``resources`` (``requests.memory``)."""
    problems: list[tuple[str, str]] = []
    parsed: dict[str, dict[str, Decimal]] = {"requests": {}, "limits": {}}
    for kind, values in (("requests", requests), ("limits", limits)):
        for name, raw in values.items():
            where = f"{kind}.{name}"
            bad_name = check_resource_name(name)
            if bad_name is not None:
                problems.append((where, bad_name))
                continue
            try:
                q = parse_quantity(raw)
            except QuantityError as exc:
                problems.append((where, str(exc)))
                continue
            if q < 0:
                problems.append((where, f"{raw!r}: must be greater than or equal to 0"))
                continue
            if (is_extended_resource(name) or name == "pods") and q != q.to_integral_value():
                problems.append((where, f"{raw!r}: {name} must be a whole number"))
                continue
            parsed[kind][name] = q
    for name, want in parsed["requests"].items():
        cap = parsed["limits"].get(name)
        if cap is None:
            continue
        if is_extended_resource(name) and want != cap:
            problems.append(
                (
                    f"requests.{name}",
                    f"{requests[name]!r}: must equal the limit {limits[name]!r} (extended resources cannot be "
                    "overcommitted)",
                )
            )
        elif want > cap:
            problems.append(
                (f"requests.{name}", f"{requests[name]!r}: must be less than or equal to the limit {limits[name]!r}")
            )
    return problems


def compute_pod_requests(pod: Mapping[str, Any], *, only: str | None = None) -> dict[str, int]:
    """A pod's effective requests in milli-units, as kube-scheduler counts them:
    max(sum of containers, largest init container) + overhead; a container that sets only a
    limit requests that limit (the API server defaults it so). ``only``: just that resource
    (placement asks for GPUs of thousands of pods). Unparseable values count as nothing."""
    spec = pod.get("spec") or {}

    def of(container: Mapping[str, Any]) -> dict[str, int]:
        res = container.get("resources") or {}
        merged = dict(res.get("limits") or {})
        merged.update(res.get("requests") or {})
        out: dict[str, int] = {}
        for key, value in merged.items():
            if only is not None and key != only:
                continue
            try:
                out[key] = to_milli(value)
            except QuantityError:
                continue
        return out

    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for key, value in of(c).items():
            total[key] = total.get(key, 0) + value
    for c in spec.get("initContainers") or ():
        for key, value in of(c).items():
            total[key] = max(total.get(key, 0), value)
    for key, value in (spec.get("overhead") or {}).items():
        if only is not None and key != only:
            continue
        try:
            total[key] = total.get(key, 0) + to_milli(value)
        except QuantityError:
            continue
    return {k: v for k, v in total.items() if v > 0}


#: The resources a pod's QoS class is computed from (kube's isSupportedQoSComputeResource):
#: extended resources such as ``nvidia.com/gpu``, ephemeral-storage and hugepages do not count.
QOS_RESOURCES = ("cpu", "memory")


def compute_pod_qos_class(spec: Mapping[str, Any]) -> str:
    """``status.qosClass`` as the API server computes it once, at creation (kube's
    ``ComputePodQOS``): from the cpu and memory of every container, init containers included
    (or of ``spec.resources`` when the pod sets pod-level resources); a limit without a request
    requests the limit (the API server defaults it so); zero and unparseable values count as
    unset. BestEffort when nothing is set; Guaranteed when every container limits both cpu and
    memory and the summed requests equal the summed limits; Burstable otherwise. A node agent
    must never write another value: the server refuses a change (``field is immutable``)."""
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True

    def positive(values: Mapping[str, Any]) -> dict[str, Decimal]:
        out: dict[str, Decimal] = {}
        for name in QOS_RESOURCES:
            if name not in values:
                continue
            try:
                q = parse_quantity(values[name])
            except (QuantityError, TypeError):
                continue
            if q > 0:
                out[name] = q
        return out

    def add(resources: Mapping[str, Any]) -> None:
        nonlocal guaranteed
        lim = dict(resources.get("limits") or {})
        req = {**lim, **(resources.get("requests") or {})}
        for name, q in positive(req).items():
            requests[name] = requests.get(name, Decimal(0)) + q
        found = positive(lim)
        for name, q in found.items():
            limits[name] = limits.get(name, Decimal(0)) + q
        if not set(QOS_RESOURCES) <= set(found):
            guaranteed = False

    pod_level = spec.get("resources")
    if isinstance(pod_level, Mapping):  # pod-level resources (beta, on by default) replace the containers'
        add(pod_level)
    else:
        for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
            if isinstance(c, Mapping):
                add(c.get("resources") or {})
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and all(limits.get(n) == q for n, q in requests.items()) and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


# --------------------------------------------------------------------------- tolerations, taints

#: Taint effects that keep a pod off a node (PreferNoSchedule only scores).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration, as in ``spec.tolerations`` (``operator`` Equal or Exists)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Mapping[str, Any]) -> bool:
        """kube's ``Toleration.ToleratesTaint``."""
        if self.effect and self.effect != (taint.get("effect") or ""):
            return False
        if self.key and self.key != (taint.get("key") or ""):
            return False
        if self.operator == "Exists":
            return True
        if self.operator in ("", "Equal"):
            # an empty key with Equal is refused by validation; kube compares values anyway
            return self.value == str(taint.get("value") or "")
        return False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Toleration:
        return cls(
            key=str(d.get("key") or ""),
            operator=str(d.get("operator") or "Equal"),
            value=str(d.get("value") or ""),
            effect=str(d.get("effect") or ""),
        )


def build_tolerations(raw: Iterable[Mapping[str, Any]]) -> tuple[Toleration, ...]:
    return tuple(Toleration.from_dict(t) for t in raw)


def untolerated_taint(
    tolerations: Sequence[Toleration], taints: Iterable[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint no toleration covers, or None."""
    for taint in taints:
        if taint.get("effect") not in BLOCKING_EFFECTS:
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


def check_toleration(
    key: str, operator: str, value: str, effect: str, toleration_seconds: int | None
) -> list[tuple[str, str]]:
    """What the pods' API refuses in one toleration, as (field, message) pairs."""
    out: list[tuple[str, str]] = []
    if key:
        problem = check_qualified_name(key)
        if problem is not None:
            out.append(("key", problem))
    elif operator != "Exists":
        out.append(("operator", "an empty key matches every taint only with operator Exists; set a key or use Exists"))
    if operator == "Exists" and value:
        out.append(("value", "must be empty when operator is Exists"))
    elif value:
        problem = check_label_value(value)
        if problem is not None:
            out.append(("value", problem))
    if toleration_seconds is not None and effect != "NoExecute":
        out.append(("tolerationSeconds", "only applies to effect NoExecute; set effect: NoExecute or remove it"))
    return out


# --------------------------------------------------------------------------- nodes


def labels_match(selector: Mapping[str, str] | Iterable[tuple[str, str]], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` carry every ``key: value`` of an equality selector (a ``nodeSelector``,
    a Service's ``selector``; a mapping or its items). An empty selector matches everything."""
    if type(selector) is dict and type(labels) is dict and None not in selector.values():
        # the same test as one subset test of the items, in C (the placement runs it per node of
        # the cluster at every decision); a None value would match a missing label below
        return selector.items() <= labels.items()
    pairs = selector.items() if isinstance(selector, Mapping) else selector
    return all(labels.get(k) == v for k, v in pairs)


def match_selector_requirement(expr: Mapping[str, Any], value: str | None) -> bool:
    """One NodeSelectorRequirement (``key``, ``operator``, ``values``) against a label or field
    value; ``value`` None when the node has none."""
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def match_node_selector_term(term: Mapping[str, Any], *, name: str, labels: Mapping[str, str]) -> bool:
    """A required node-affinity term against the node ``name`` with ``labels``: all its
    expressions and fields match; an empty term matches nothing."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    for expr in exprs:
        if not match_selector_requirement(expr, labels.get(str(expr.get("key")))):
            return False
    for expr in fields:
        value = name if expr.get("key") == "metadata.name" else None
        if not match_selector_requirement(expr, value):
            return False
    return True



def node_is_ready(node: Mapping[str, Any] | None) -> bool:
    """Whether the node's ``Ready`` condition is True (a missing node or condition: not ready)."""
    if node is None:
        return False
    for c in (node.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def node_ready_changed_at(node: Mapping[str, Any] | None) -> str | None:
    """The ``lastTransitionTime`` of the node's Ready condition (None: unknown)."""
    if node is None:
        return None
    for c in (node.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            t = c.get("lastTransitionTime")
            return str(t) if t else None
    return None
