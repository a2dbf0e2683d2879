"""Kubernetes resource quantities ("500m", "64Gi", "2", "1e3"), parsed exactly as the API server does.

One rule for everyone: the TrainingJob models and ``railyard validate`` (which strings are
quantities), the CRD schema (:data:`QUANTITY_PATTERN`, the same language as a regular
expression), placement (GPUs per node and per pod), the gang-scheduler builders (summing a
gang's requests) and the local cluster's scheduler (requests against allocatable).

:func:`parse_quantity` follows apimachinery's ``resource.ParseQuantity`` (Go) step by step,
quirks included: an optional sign, digits with an optional fraction (either part may be empty:
``"."``, ``"+"`` and ``"k"`` are zero), then one suffix: decimal SI ``n u m "" k M G T P E``,
binary SI ``Ki Mi Gi Ti Pi Ei``, or a decimal exponent ``e<int>`` / ``E<int>``. Values are exact
(:class:`decimal.Decimal`), rounded up to the nano unit as Kubernetes rounds them.
kubernetes' Python client has a ``parse_quantity`` too, but it accepts strings the API server
refuses (``1K``, ``1mi``, ``1_000``, ``" 1"``, ``NaN``) and refuses some it accepts (``.``), and
``logic/`` may not import kubernetes; tests/api compare the two.
"""

from __future__ import annotations

import math
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, ROUND_FLOOR, Decimal, Inexact, localcontext

#: Decimal SI suffixes: the power of ten each stands for.
DECIMAL_SUFFIXES: dict[str, int] = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
#: Binary SI suffixes: the power of two each stands for.
BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
_INT64_MAX = (1 << 63) - 1
#: Digits an int64 holds with room to spare (apimachinery's maxInt64Factors).
_MAX_INT64_FACTORS = 18

_NUMBER = r"[0-9]*(\.[0-9]*)?"
_SUFFIX = r"([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)?"
#: The quantity language as a regular expression (RE2 and Python ``re``), for CRD schemas. It
#: matches exactly the non-empty strings :func:`parse_quantity` accepts, except exponents past
#: int64 (``1e99999999999999999999``), which only the parser refuses.
QUANTITY_PATTERN = rf"^[+-]?{_NUMBER}{_SUFFIX}$"
#: Quantities that are not negative (what the pods' API wants in requests and limits): a minus
#: sign only in front of a zero.
NON_NEGATIVE_QUANTITY_PATTERN = rf"^(\+?{_NUMBER}|-0*(\.0*)?){_SUFFIX}$"


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def _refuse(value: str) -> QuantityError:
    return QuantityError(f"{value!r} is not a Kubernetes quantity; write e.g. '2', '500m', '64Gi' or '1e3'")


def _split(s: str) -> tuple[bool, str, str, str, str]:
    """apimachinery's parseQuantityString: (positive, numeric value, integer digits without
    leading zeros, fraction digits, suffix)."""
    positive, pos, end = True, 0, len(s)
    if pos < end and s[0] in "+-":
        positive = s[0] == "+"
        pos += 1
    while pos < end and s[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and s[pos] in _DIGITS:
        pos += 1
    num = s[start:pos] or "0"
    denom = ""
    if pos < end and s[pos] == ".":
        pos += 1
        start = pos
        while pos < end and s[pos] in _DIGITS:
            pos += 1
        denom = s[start:pos]
        if pos >= end:
            return positive, s, num, denom, ""
    value = s[:pos]
    suffix_start = pos
    while pos < end and s[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and s[pos] in "+-":
        pos += 1
    while pos < end and s[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise _refuse(s)
    return positive, value, num, denom, s[suffix_start:]


def _interpret(suffix: str, original: str) -> tuple[int, int, str]:
    """(base, exponent, format) of a suffix, as apimachinery's suffixHandler.interpret."""
    if suffix in DECIMAL_SUFFIXES:
        return 10, DECIMAL_SUFFIXES[suffix], "DecimalSI"
    if suffix in BINARY_SUFFIXES:
        return 2, BINARY_SUFFIXES[suffix], "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE":
        rest = suffix[1:]
        digits = rest[1:] if rest[0] in "+-" else rest
        if digits and all(c in _DIGITS for c in digits):
            exp = int(rest)
            if -(1 << 63) <= exp <= _INT64_MAX:
                # Go parses an int64 and keeps an int32 (it wraps)
                return 10, ((exp + (1 << 31)) % (1 << 32)) - (1 << 31), "DecimalExponent"
    raise _refuse(original)


def parse_quantity(value: str | int) -> Decimal:
    """The exact value of a quantity: ``parse_quantity("1500m") == Decimal("1.5")``.

    Raises :class:`QuantityError` (a ValueError) for anything the API server refuses."""
    if isinstance(value, bool):
        raise _refuse(str(value))
    if isinstance(value, int):
        return Decimal(value)
    s = str(value)
    if not s:
        raise QuantityError("'' is not a Kubernetes quantity: give a value such as '2', '500m' or '64Gi'")
    positive, _, num, denom, suffix = _split(s)
    base, exponent, fmt = _interpret(suffix, s)
    with localcontext() as ctx:
        ctx.prec = max(64, len(num) + len(denom) + 40)
        ctx.Emax, ctx.Emin = MAX_EMAX, MIN_EMIN
        magnitude = Decimal(f"{num}.{denom or '0'}")
        amount = magnitude.scaleb(exponent) if base == 10 else magnitude * Decimal(2) ** exponent
        # Go keeps values that fit an int64 mantissa as they are; the others go through inf.Dec,
        # which rounds up (away from zero) to the nano unit and caps SI formats at 2^63 - 1.
        fast = _fast_path(num, denom, exponent, fmt)
        if not fast:
            if amount != 0 and int(amount.as_tuple().exponent) < -9:
                ctx.prec = max(ctx.prec, amount.adjusted() + 12)
                amount = amount.quantize(Decimal("1e-9"), rounding=ROUND_CEILING)
            if fmt in ("DecimalSI", "BinarySI") and amount > _INT64_MAX:
                amount = Decimal(_INT64_MAX)
        result = amount if positive else -amount
        return result + 0  # normalise -0 to 0


def _fast_path(num: str, denom: str, exponent: int, fmt: str) -> bool:
    """Whether apimachinery takes its int64 fast path (no rounding, no cap) for this value."""
    if fmt == "BinarySI":
        if denom:
            return False
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1
        scale = 0
        mantissa = 1 << exponent
    else:
        precision = _MAX_INT64_FACTORS - (len(num) + len(denom))
        scale = exponent
        mantissa = 1
    if precision < 0:
        return False
    scale -= len(denom)
    if scale < -9:
        return False
    product = int(num + denom) * mantissa
    return -(1 << 63) <= product <= _INT64_MAX


def is_quantity(value: str) -> bool:
    try:
        parse_quantity(value)
    except QuantityError:
        return False
    return True


def to_milli(value: str | int) -> int:
    """The quantity in milli-units, rounded up (as Kubernetes rounds requests)."""
    with localcontext() as ctx:
        ctx.prec = 80
        return math.ceil(parse_quantity(value) * 1000)


def to_count(value: str | int | None) -> int:
    """A countable resource (``nvidia.com/gpu``, ``pods``) as an int, rounded down; 0 for an
    absent or malformed value (a node that advertises garbage offers nothing)."""
    if value is None:
        return 0
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)  # the common case, and exactly what the parser would say
    try:
        q = parse_quantity(value)
    except QuantityError:
        return 0
    return int(q.to_integral_value(rounding=ROUND_FLOOR))


def format_quantity(value: Decimal, *, like: str | None = None) -> str:
    """A quantity string for ``value`` that :func:`parse_quantity` reads back exactly; in the
    SI suffix of ``like`` when it has one (``3 x "500m"`` is ``"1500m"``, ``2 x "1.5Gi"`` is
    ``"3Gi"``), else plain decimal."""
    suffix = ""
    if like:
        try:
            suffix = _split(like)[4]
        except QuantityError:
            suffix = ""
    if suffix in BINARY_SUFFIXES:
        unit = Decimal(2) ** BINARY_SUFFIXES[suffix]
    elif suffix in DECIMAL_SUFFIXES:
        unit = Decimal(1).scaleb(DECIMAL_SUFFIXES[suffix])
    else:
        suffix, unit = "", Decimal(1)
    with localcontext() as ctx:
        ctx.prec = 80
        ctx.clear_flags()
        scaled = value / unit
        if ctx.flags[Inexact]:
            suffix, scaled = "", value
        text = format(scaled.normalize(), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return (text or "0") + suffix


def format_milli(milli: int, resource: str) -> str:
    """A readable quantity for messages: cores for cpu, bytes otherwise."""
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"
