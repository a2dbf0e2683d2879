"""What to do when the API server refuses one of the gang's own objects (its pods, ConfigMap,
Service, Secret or PodGroup; a create or the patch that lifts the gates).

A refusal is either permanent (the object as built can never be accepted: it is invalid, or an
admission policy such as Pod Security forbids it): the job goes ``Failed`` with the server's
message, and a new spec generation starts it again; or it can pass later (quota, an operator
without the RBAC it needs, a namespace being deleted, throttling, an API server that is
unavailable): the job waits in ``Placing`` with the reason and the server's message, and the
gang is created again after a delay. Either way the half-created gang is removed first (no half
gangs) and an Event says so; nothing retries silently.

A table, first match wins: the HTTP status, and words of the server's message that tell the
403s apart (the API server uses 403 Forbidden for quota, RBAC, Pod Security, admission
policies and terminating namespaces alike).
"""

from __future__ import annotations

from dataclasses import dataclass

SERVER_ERRORS = frozenset({0, *range(500, 600)})  # 0: no answer at all


@dataclass(frozen=True, slots=True)
class Rule:
    statuses: frozenset[int]
    #: Every one of these (lower case) occurs in the server's message; empty: any message.
    words: tuple[str, ...]
    #: The job's condition reason (and Event reason).
    reason: str
    permanent: bool
    #: For a refusal that can pass later: seconds until the gang is created again.
    retry_s: float
    #: What to do about it, for the person reading the condition.
    hint: str


def _rule(
    statuses: set[int] | frozenset[int], words: tuple[str, ...], reason: str, permanent: bool, retry_s: float, hint: str
) -> Rule:
    return Rule(frozenset(statuses), words, reason, permanent, retry_s, hint)


_FIX = "fix the TrainingJob and apply it again (a new spec generation starts the job again)"

RULES: tuple[Rule, ...] = (
    _rule(
        {403},
        ("exceeded quota",),
        "QuotaExceeded",
        False,
        30.0,
        "the namespace's ResourceQuota has no room for the gang: free or raise the quota, or use fewer or smaller pods",
    ),
    _rule(
        {403},
        ("violates podsecurity",),
        "PodSecurityViolation",
        True,
        0.0,
        "the namespace's Pod Security level forbids the gang's pods: change the namespace's "
        "pod-security.kubernetes.io/enforce label or the spec, then " + _FIX,
    ),
    _rule({403}, ("being terminated",), "NamespaceTerminating", False, 10.0, "the namespace is being deleted"),
    # admission looks up objects the pods name; they may be created after the job (one apply)
    _rule(
        {403},
        ("error looking up service account",),
        "ServiceAccountNotFound",
        False,
        10.0,
        "create the ServiceAccount that spec.serviceAccountName names, or remove the field",
    ),
    _rule(
        {403},
        ("no priorityclass with name",),
        "PriorityClassNotFound",
        False,
        10.0,
        "create the PriorityClass that spec.gang.priorityClassName names, or remove the field",
    ),
    _rule(
        {403},
        (" cannot ", " resource "),
        "OperatorNotPermitted",
        False,
        30.0,
        "the operator's ServiceAccount lacks this permission: grant it (the Helm chart's RBAC rules, "
        "helm/railyard/rbac-rules.yaml)",
    ),
    _rule(
        {400, 403, 422},
        ("admission webhook",),
        "AdmissionDenied",
        True,
        0.0,
        "an admission webhook of the cluster refused it: change the spec to satisfy it, then " + _FIX,
    ),
    _rule(
        {403},
        (),
        "AdmissionDenied",
        True,
        0.0,
        "an admission policy of the cluster forbids it: change the spec to satisfy the rule named above, then " + _FIX,
    ),
    _rule(
        {400, 422},
        (),
        "ObjectInvalid",
        True,
        0.0,
        "the object built from the TrainingJob is invalid (the message names the field): " + _FIX,
    ),
    _rule({413}, (), "ObjectTooLarge", True, 0.0, "the object is larger than the API server accepts: " + _FIX),
    _rule({409}, (), "Conflict", False, 2.0, "a concurrent change; trying again"),
    _rule(
        {404}, (), "NotFound", False, 10.0, "the namespace, or the kind of object, does not exist on this API server"
    ),
    _rule({429}, (), "TooManyRequests", False, 10.0, "the API server is throttling requests"),
    _rule(
        {401}, (), "Unauthorized", False, 10.0, "the API server refused the operator's credentials (an expired token?)"
    ),
    _rule(SERVER_ERRORS, (), "ApiServerUnavailable", False, 10.0, "the API server failed to answer"),
)
#: Anything else the server refuses (an unexpected 4xx): the object will not pass as it is.
FALLBACK = _rule(set(), (), "ObjectRejected", True, 0.0, "the API server refused the object: " + _FIX)

#: Reasons of permanent refusals: a Failed job with one of these starts again on a spec edit.
PERMANENT_REASONS = frozenset(r.reason for r in (*RULES, FALLBACK) if r.permanent)


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    permanent: bool
    retry_after_s: float
    #: The condition message: what was refused, the server's own words, and what to do.
    message: str


def decide_rejection(status: int, server_reason: str, server_message: str, *, what: str) -> Rejection:
    """The decision for the API server refusing ``what`` (e.g. "Pod j-a0-1") with ``status``,
    its Status ``reason`` (``Forbidden``, ``Invalid`` ...) and ``message``."""
    text = server_message.lower()
    rule = next((r for r in RULES if status in r.statuses and all(w in text for w in r.words)), FALLBACK)
    said = f"{status} {server_reason}".strip() if status else "no answer"
    message = f"the API server refused {what} ({said}): {server_message.strip() or 'no message'}; {rule.hint}"
    if not rule.permanent:
        message += f" (trying again in {rule.retry_s:g}s)"
    return Rejection(rule.reason, rule.permanent, rule.retry_s, message)
