"""The Kubernetes rules of railyard.api.quantity and railyard.api.corev1: one quantity parser
(checked against known API-server answers and, on many generated strings, against the
kubernetes client's parse_quantity), its regular expression (the CRD's pattern) accepting the
same language, and the fields a pod create would refuse refused at apply time by both the CRD
and ``railyard validate``."""

from __future__ import annotations

import copy
import re
from decimal import Decimal, InvalidOperation
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as client_parse_quantity

from railyard.api.corev1 import (
    Toleration,
    check_resource_requirements,
    node_is_ready,
    untolerated_taint,
)
from railyard.api.crd import build_crd
from railyard.api.quantity import (
    NON_NEGATIVE_QUANTITY_PATTERN,
    QUANTITY_PATTERN,
    QuantityError,
    format_quantity,
    parse_quantity,
)
from railyard.api.validation import validate_manifest
from railyard_local.apiserver.schema import Schema

INT64_MAX = (1 << 63) - 1

# What apimachinery's resource.ParseQuantity answers (traced through its source, quirks included).
KNOWN = [
    ("1", Decimal(1)), ("0", Decimal(0)), ("500m", Decimal("0.5")), ("1k", Decimal(1000)),
    ("1Ki", Decimal(1024)), ("1.5Gi", Decimal(3 * 2**29)), ("64Gi", Decimal(64 * 2**30)),
    ("1e3", Decimal(1000)), ("1E3", Decimal(1000)), ("1e-3", Decimal("0.001")), ("2E", Decimal(2 * 10**18)),
    ("+5", Decimal(5)), ("-5", Decimal(-5)), ("5.", Decimal(5)), (".5", Decimal("0.5")), ("007", Decimal(7)),
    ("1n", Decimal("1e-9")), ("1u", Decimal("1e-6")),
    # below the nano unit rounds up (away from zero), as Kubernetes rounds requests
    ("0.5n", Decimal("1e-9")), ("-0.5n", Decimal("-1e-9")), ("1.0000000001", Decimal("1.000000001")),
    # the SI formats are capped at 2^63-1 once past the int64 fast path
    ("9223372036854775808", Decimal(INT64_MAX)),
    # Go's quirks: an empty number is zero
    (".", Decimal(0)), ("+", Decimal(0)), ("-", Decimal(0)), ("k", Decimal(0)), ("Mi", Decimal(0)),
]
REFUSED = ["", "lots", "1K", "1ki", "1mi", "1e", "1.2.3", "1 k", " 1", "1_000", "NaN", "Infinity", "1Kib", "1e3m", "--1", "1e+", "0x10", "1m3"]


@pytest.mark.parametrize(("text", "value"), KNOWN)
def test_quantities_parse_as_the_api_server_parses_them(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value
    assert re.fullmatch(QUANTITY_PATTERN, text)


@pytest.mark.parametrize("text", REFUSED)
def test_strings_the_api_server_refuses_are_refused_with_a_fix(text: str) -> None:
    with pytest.raises(QuantityError, match="Kubernetes quantity"):
        parse_quantity(text)
    assert not text or not re.fullmatch(QUANTITY_PATTERN, text)


def _accepts(text: str) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def _client(text: str) -> Decimal | None:
    try:
        return Decimal(client_parse_quantity(text))
    except (ValueError, InvalidOperation, TypeError):
        return None


_sign = st.sampled_from(["", "+", "-"])
_digits = st.text("0123456789", min_size=1, max_size=12)
_number = st.one_of(
    _digits,
    st.builds(lambda a, b: f"{a}.{b}", _digits, _digits),
    st.builds(lambda a: f"{a}.", _digits),
    st.builds(lambda b: f".{b}", _digits),
)
_suffix = st.one_of(
    st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
    st.builds(lambda e, s, d: f"{e}{s}{d}", st.sampled_from("eE"), _sign, st.text("0123456789", min_size=1, max_size=2)),
)
GRAMMAR = st.builds(lambda s, n, x: s + n + x, _sign, _number, _suffix)


@settings(max_examples=600, deadline=None)
@given(GRAMMAR)
def test_the_documented_grammar_agrees_with_the_kubernetes_client(text: str) -> None:
    """Every string of the quantity grammar in the Kubernetes docs: we and the client's
    parse_quantity accept it and agree on its value (ours rounds up to the nano unit and caps at
    2^63-1 where the API server does; the client does neither)."""
    ours = parse_quantity(text)
    theirs = _client(text)
    assert theirs is not None, text
    if abs(ours) == INT64_MAX and abs(theirs) > INT64_MAX:
        return
    assert abs(ours - theirs) <= Decimal("1e-9"), (text, ours, theirs)
    assert re.fullmatch(QUANTITY_PATTERN, text)


def _client_leniency(text: str) -> bool:
    """Strings the Python client takes that the API server refuses: Decimal's own syntax
    (whitespace, '_', NaN/Infinity, a second sign), or suffixes Go does not know (K, ki, mi, ni,
    ui, Ki on a bad number)."""
    if any(c in text for c in " _") or any(w in text.lower() for w in ("nan", "inf")):
        return True
    return bool(re.search(r"(K|[kmnuMGTPE]i)$", text)) or text.count("+") + text.count("-") > 1 or bool(re.search(r"[eE][+-]?[0-9]+[kKmnuMGTPE]i?$", text))


@settings(max_examples=1500, deadline=None)
@given(st.text("0123456789.+-eEinumkKMGTP_ ", max_size=8))
def test_any_string_gets_one_verdict_from_parser_pattern_and_a_known_difference_from_the_client(text: str) -> None:
    ours = _accepts(text)
    # the CRD's pattern is the same language (plus non-empty, which the schema's minLength adds)
    assert ours == bool(text and re.fullmatch(QUANTITY_PATTERN, text)), text
    non_negative = ours and parse_quantity(text) >= 0
    assert non_negative == bool(text and re.fullmatch(NON_NEGATIVE_QUANTITY_PATTERN, text)), text
    theirs = _client(text)
    if ours and theirs is not None:
        assert abs(parse_quantity(text) - theirs) <= Decimal("1e-9") or abs(parse_quantity(text)) == INT64_MAX, text
    elif ours:
        # Go reads an empty number as zero ("k", ".", "+"); the client refuses those
        assert parse_quantity(text) == 0 and not re.search(r"[0-9]", text.split("e")[0].split("E")[0]), text
    elif theirs is not None:
        assert _client_leniency(text), f"the client takes {text!r} and we do not"


@given(st.decimals(min_value=0, max_value=10**12, places=3, allow_nan=False, allow_infinity=False), st.sampled_from(["1", "500m", "2Gi", "1k", "3"]))
def test_formatted_quantities_read_back_exactly(value: Decimal, like: str) -> None:
    assert parse_quantity(format_quantity(value, like=like)) == value


# --------------------------------------------------------------------------- pods' API rules at apply time


def _manifest(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "tiny"}, "spec": spec}


def _server_causes(manifest: dict[str, Any]) -> list[str]:
    """The embedded API server's schema verdict on a create (defaulting then validation)."""
    schema = Schema(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    obj = copy.deepcopy(manifest)
    schema.default(obj)
    # the server writes map keys as requests[memory]; name fields the way validate does
    key = re.compile(r"\[([^0-9\]][^\]]*)\]")
    return [key.sub(r".\1", c.field) + f": {c.detail}" for c in schema.validate(obj, None)]


BAD_FIELDS = [
    ({"resources": {"requests": {"memory": "lots"}}}, "spec.resources.requests.memory"),
    ({"resources": {"limits": {"cpu": "-1"}}}, "spec.resources.limits.cpu"),
    ({"env": [{"name": "A=B", "value": "x"}]}, "spec.env[0].name"),
    ({"nodeSelector": {"pool": "not a label value"}}, "spec.nodeSelector.pool"),
    ({"gang": {"queueName": "q" * 64}}, "spec.gang.queueName"),
    ({"serviceAccountName": "Not_A_Name"}, "spec.serviceAccountName"),
]
#: Map keys: a structural schema has no pattern for keys, and a CEL rule over a map's keys costs
#: more than a real API server's budget allows, so only the models (``railyard validate``, and the
#: operator's Failed/InvalidSpec) check these.
BAD_KEYS = [
    ({"nccl": {"NCCL=X": "1"}}, "spec.nccl"),
    ({"nodeSelector": {"bad key": "v"}}, "spec.nodeSelector"),
    ({"resources": {"requests": {"bogus": "1"}}}, "spec.resources.requests"),
]


@pytest.mark.parametrize(("spec", "field"), BAD_FIELDS)
def test_fields_a_pod_create_would_refuse_are_refused_at_apply_time(spec: dict[str, Any], field: str) -> None:
    manifest = _manifest(**spec)
    problems = [str(p) for p in validate_manifest(manifest)]
    assert any(p.startswith(field) for p in problems), problems
    causes = _server_causes(manifest)
    assert any(c.startswith(f"{field}: ") for c in causes), causes


@pytest.mark.parametrize(("spec", "field"), BAD_KEYS)
def test_bad_map_keys_are_refused_by_validate(spec: dict[str, Any], field: str) -> None:
    problems = [str(p) for p in validate_manifest(_manifest(**spec))]
    assert any(p.startswith(field) for p in problems), problems


def test_the_quantity_case_names_the_field_in_both_verdicts() -> None:
    manifest = _manifest(resources={"requests": {"memory": "lots"}})
    (problem,) = validate_manifest(manifest)
    assert problem.path == "spec.resources.requests.memory" and "'lots' is not a Kubernetes quantity" in problem.message
    (cause,) = _server_causes(manifest)
    assert cause.startswith("spec.resources.requests.memory: ")


@pytest.mark.parametrize(
    ("requests", "limits", "field"),
    [
        ({"nvidia.com/gpu": "1.5"}, {}, "requests.nvidia.com/gpu"),
        ({"cpu": "2"}, {"cpu": "1"}, "requests.cpu"),
        ({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}, "requests.nvidia.com/gpu"),
        ({"pods": "1"}, {}, "requests.pods"),
        ({"kubernetes.io/foo": "1"}, {}, "requests.kubernetes.io/foo"),
    ],
)
def test_resource_rules_of_the_pods_api(requests: dict[str, str], limits: dict[str, str], field: str) -> None:
    problems = check_resource_requirements(requests, limits)
    assert [f for f, _ in problems] == [field]
    assert validate_manifest(_manifest(resources={"requests": requests, "limits": limits}))


def test_valid_resources_pass_both_verdicts() -> None:
    manifest = _manifest(resources={"requests": {"cpu": "500m", "memory": "64Gi", "nvidia.com/gpu": "1", "hugepages-2Mi": "1Gi"}, "limits": {"nvidia.com/gpu": "1", "cpu": "1"}})
    assert validate_manifest(manifest) == []
    assert _server_causes(manifest) == []


# --------------------------------------------------------------------------- tolerations, readiness


@pytest.mark.parametrize(
    ("toleration", "taint", "ok"),
    [
        ({"key": "gpu", "operator": "Exists"}, {"key": "gpu", "value": "x", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "x"}, {"key": "gpu", "value": "x", "effect": "NoExecute"}, True),
        ({"key": "gpu", "value": "y"}, {"key": "gpu", "value": "x", "effect": "NoSchedule"}, False),
        ({"operator": "Exists", "effect": "NoSchedule"}, {"key": "any", "effect": "NoSchedule"}, True),
        ({"operator": "Exists", "effect": "NoSchedule"}, {"key": "any", "effect": "NoExecute"}, False),
    ],
)
def test_toleration_matching_follows_kube(toleration: dict[str, str], taint: dict[str, str], ok: bool) -> None:
    assert Toleration.from_dict(toleration).tolerates(taint) == ok
    assert (untolerated_taint([Toleration.from_dict(toleration)], [taint]) is None) == ok


def test_prefer_no_schedule_never_blocks_and_readiness_reads_the_ready_condition() -> None:
    assert untolerated_taint([], [{"key": "x", "effect": "PreferNoSchedule"}]) is None
    assert node_is_ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert not node_is_ready({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
    assert not node_is_ready({"status": {}}) and not node_is_ready(None)


def test_an_empty_toleration_key_needs_exists() -> None:
    problems = [str(p) for p in validate_manifest(_manifest(tolerations=[{"operator": "Equal", "value": "v"}]))]
    assert any("spec.tolerations[0]" in p and "Exists" in p for p in problems), problems
