"""Kubernetes resource quantities ("500m", "64Gi", "2") as exact integers.

The scheduler compares requests with allocatable amounts; doing that in floats would let
rounding admit a pod that does not fit. Every quantity is kept in milli-units (an int), the
precision Kubernetes itself uses for CPU.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIX: dict[str, Decimal] = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Decimal:
    """The exact value of a quantity: ``parse_quantity("1500m") == Decimal("1.5")``."""
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = value.strip()
    match = _RE.match(text)
    if not match:
        raise QuantityError(
            f"{value!r} is not a Kubernetes quantity; write e.g. '2', '500m', '64Gi' or '1e3'"
        )
    number, suffix = match.groups()
    try:
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation as exc:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity") from exc


def to_milli(value: str | int | float) -> int:
    """The quantity in milli-units, rounded up (as Kubernetes rounds requests)."""
    return math.ceil(parse_quantity(value) * 1000)


def format_milli(milli: int, resource: str) -> str:
    """A readable quantity for messages: cores for cpu, bytes otherwise."""
    if resource == "cpu":
        return f"{milli}m" if milli % 1000 else str(milli // 1000)
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"
