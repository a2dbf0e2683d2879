"""The contract's building blocks and its wire format, standard library only: a section of
settings (:func:`section`, :func:`setting`), and :func:`parse` / :func:`to_wire` between those
sections and ``config.json``'s camelCase JSON, reporting every problem at once, each naming its
field path. The sections themselves are declared in :mod:`railyard.protocol.trainerconfig`."""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import (
    Any,
    Literal,
    TypeVar,
    Union,
    dataclass_transform,
    get_args,
    get_origin,
    get_type_hints,
)

T = TypeVar("T")


def setting(
    *,
    default: Any = MISSING,
    description: str,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
) -> Any:
    """One setting of a :func:`section`: its default (none: required), what it means (the CRD's
    description, shown by ``kubectl explain``) and its bounds, by ``pydantic.Field``'s names:
    numbers ``ge``/``gt``/``le``; lengths of strings and lists ``min_length``/``max_length``."""
    bounds = {"ge": ge, "gt": gt, "le": le, "min_length": min_length, "max_length": max_length}
    return field(
        default=default, metadata={"description": description, **{k: v for k, v in bounds.items() if v is not None}}
    )


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(setting,))
def section(cls: type[T]) -> type[T]:
    """A section of settings: a frozen dataclass taking keyword arguments only. A nested section's
    default is an instance (frozen, so one instance is safely shared)."""
    return dataclass(frozen=True, kw_only=True)(cls)


def wire_name(name: str) -> str:
    """snake_case -> camelCase, as pydantic's ``to_camel`` (the CRD's field names)."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return True, args[0]
    return False, tp


class _Bad:
    """A value that failed to convert (its problem is already recorded)."""


_BAD = _Bad()


def _check_bounds(value: Any, bounds: Mapping[str, Any], where: str, problems: list[str]) -> bool:
    n = len(value) if isinstance(value, str | tuple) else None
    for key, limit in bounds.items():
        if key == "ge" and not value >= limit:
            problems.append(f"{where}: {value!r} is below the minimum {limit}")
        elif key == "gt" and not value > limit:
            problems.append(f"{where}: {value!r} must be above {limit}")
        elif key == "le" and not value <= limit:
            problems.append(f"{where}: {value!r} is above the maximum {limit}")
        elif key == "min_length" and n is not None and n < limit:
            problems.append(f"{where}: must not be empty" if limit == 1 else f"{where}: needs at least {limit} items")
        elif key == "max_length" and n is not None and n > limit:
            problems.append(f"{where}: at most {limit} {'characters' if isinstance(value, str) else 'items'}")
        else:
            continue
        return False
    return True


def _convert(tp: Any, raw: Any, where: str, bounds: Mapping[str, Any], problems: list[str]) -> Any:
    optional, inner = _is_optional(tp)
    if raw is None:
        if optional:
            return None
        problems.append(f"{where}: must not be null")
        return _BAD
    tp = inner
    origin = get_origin(tp)
    if origin is Literal:
        choices = get_args(tp)
        if raw not in choices:
            problems.append(f"{where}: {raw!r} is not one of {', '.join(map(str, choices))}")
            return _BAD
        return raw
    if is_dataclass(tp) and isinstance(tp, type):
        return _parse(tp, raw, where + ".", problems)
    if origin is dict:  # a JSON object passed through as it is (its reader checks its keys)
        if not isinstance(raw, Mapping):
            problems.append(f"{where}: expected an object, got {type(raw).__name__}")
            return _BAD
        return dict(raw)
    if origin is tuple:
        item_tp = get_args(tp)[0]
        if not isinstance(raw, list | tuple):
            problems.append(f"{where}: expected a list")
            return _BAD
        items = [_convert(item_tp, x, f"{where}[{i}]", {}, problems) for i, x in enumerate(raw)]
        value: Any = tuple(x for x in items if x is not _BAD)
    elif tp is bool:
        if not isinstance(raw, bool):
            problems.append(f"{where}: expected true or false, got {raw!r}")
            return _BAD
        value = raw
    elif tp is int:
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int):
            problems.append(f"{where}: expected a whole number, got {raw!r}")
            return _BAD
        value = raw
    elif tp is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            problems.append(f"{where}: expected a finite number, got {raw!r}")
            return _BAD
        value = float(raw)
    elif tp is str:
        if not isinstance(raw, str):
            problems.append(f"{where}: expected a string, got {raw!r}")
            return _BAD
        value = raw
    else:  # pragma: no cover - a field type this reader does not know
        raise TypeError(f"{where}: unsupported field type {tp!r}")
    return value if _check_bounds(value, bounds, where, problems) else _BAD


def _parse(cls: type[T], raw: Any, where: str, problems: list[str]) -> T:
    if raw is None:
        raw = {}
    label = where.rstrip(".") or "config"
    if not isinstance(raw, Mapping):
        problems.append(f"{label}: expected an object, got {type(raw).__name__}")
        raw = {}
    hints = _hints(cls)
    by_wire = {wire_name(f.name): f for f in fields(cls)}  # type: ignore[arg-type]
    for key in raw:
        if key not in by_wire:
            close = [w for w in by_wire if w.lower() == str(key).lower().replace("_", "")]
            hint = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(sorted(by_wire))}"
            problems.append(f"{where}{key}: unknown field{hint}")
    values: dict[str, Any] = {}
    for wire, f in by_wire.items():
        if wire not in raw:
            if f.default is MISSING and f.default_factory is MISSING:
                problems.append(f"{where}{wire}: required")
                return _BAD  # type: ignore[return-value]
            continue
        v = _convert(hints[f.name], raw[wire], where + wire, f.metadata, problems)
        if v is not _BAD:
            values[f.name] = v
    try:
        return cls(**values)
    except TypeError:  # a required field failed to convert (its problem is recorded)
        return _BAD  # type: ignore[return-value]


class SchemaError(ValueError):
    """Every problem of one config section, each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse(cls: type[T], raw: Any, *, where: str = "", problems: list[str] | None = None) -> T:
    """``raw`` (camelCase mapping) as ``cls``; missing fields take the schema's defaults.

    With ``problems`` given, problems are appended there and the defaults stand in for bad
    values; without it, :class:`SchemaError` is raised listing all of them.
    """
    out: list[str] = [] if problems is None else problems
    prefix = where + "." if where and not where.endswith(".") else where
    value = _parse(cls, raw, prefix, out)
    if problems is None and out:
        raise SchemaError(out)
    if isinstance(value, _Bad):
        return cls()
    return value


def to_wire(obj: Any, *, keep_none: bool = False) -> Any:
    """A section as its camelCase JSON value, as config.json carries it; None fields are left
    out unless ``keep_none``."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {
            wire_name(f.name): to_wire(value, keep_none=keep_none)
            for f in fields(obj)
            if (value := getattr(obj, f.name)) is not None or keep_none
        }
    if isinstance(obj, tuple | list):
        return [to_wire(x, keep_none=keep_none) for x in obj]
    return obj


__all__ = ["SchemaError", "parse", "section", "setting", "to_wire", "wire_name"]
