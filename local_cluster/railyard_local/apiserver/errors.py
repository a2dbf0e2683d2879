"""Kubernetes ``Status`` errors, raised by the server logic and rendered by the HTTP layer."""

from __future__ import annotations

from typing import Any

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
}


class APIError(Exception):
    """An error the API returns as a ``Status`` object."""

    def __init__(self, code: int, message: str, *, reason: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = _REASONS.get(code, "Unknown") if reason is None else reason  # "": none, as upstream's 500s
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.message, self.reason, self.details)


def status_object(code: int, message: str, reason: str, details: dict[str, Any] | None = None,
                  *, success: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if success else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        out["details"] = details
    if success or not reason:
        del out["reason"]
    if success and not message:
        del out["message"]
    return out


def resource_name(group: str, plural: str) -> str:
    return plural if not group else f"{plural}.{group}"


def details_of(name: str, group: str, kind: str, **extra: Any) -> dict[str, Any]:
    """StatusDetails as Go serialises it: empty fields omitted."""
    out: dict[str, Any] = {k: v for k, v in (("name", name), ("group", group), ("kind", kind)) if v}
    out.update(extra)
    return out


def not_found(group: str, plural: str, name: str) -> APIError:
    return APIError(404, f'{resource_name(group, plural)} "{name}" not found', details=details_of(name, group, plural))


def already_exists(group: str, plural: str, name: str) -> APIError:
    return APIError(409, f'{resource_name(group, plural)} "{name}" already exists',
                    reason="AlreadyExists", details=details_of(name, group, plural))


def conflict(group: str, plural: str, name: str, why: str) -> APIError:
    return APIError(409, f'Operation cannot be fulfilled on {resource_name(group, plural)} "{name}": {why}',
                    reason="Conflict", details=details_of(name, group, plural))


def bad_request(message: str) -> APIError:
    return APIError(400, message)


class Cause:
    """One field error, rendered like the apiserver's field.Error."""

    def __init__(self, field: str, reason: str, detail: str) -> None:
        self.field = field
        self.reason = reason
        self.detail = detail

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.detail, "field": self.field}

    def __str__(self) -> str:
        return f"{self.field}: {self.detail}" if self.field else self.detail


def _fmt(value: Any) -> str:
    import json

    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


def invalid_value(field: str, value: Any, detail: str) -> Cause:
    return Cause(field, "FieldValueInvalid", f"Invalid value: {_fmt(value)}: {detail}")


def required(field: str, detail: str = "") -> Cause:
    return Cause(field, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))


def forbidden(field: str, detail: str) -> Cause:
    return Cause(field, "FieldValueForbidden", f"Forbidden: {detail}")


def not_supported(field: str, value: Any, allowed: list[Any]) -> Cause:
    import json

    vals = ", ".join(json.dumps(a) for a in allowed)
    return Cause(field, "FieldValueNotSupported", f"Unsupported value: {_fmt(value)}: supported values: {vals}")


def type_invalid(field: str, value: Any, detail: str) -> Cause:
    return Cause(field, "FieldValueTypeInvalid", f"Invalid value: {_fmt(value)}: {detail}")


def too_many(field: str, actual: int, limit: int) -> Cause:
    return Cause(field, "FieldValueTooMany", f"Too many: {actual}: must have at most {limit} items")


def duplicate(field: str, value: Any) -> Cause:
    """Go's field.Duplicate prints its value as JSON, a list-map item's key fields included
    (kueue-v0.13-workload 016: ``Duplicate value: {"name":"workers"}``)."""
    import json

    shown = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return Cause(field, "FieldValueDuplicate", f"Duplicate value: {shown}")


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> APIError:
    qualified = kind if not group else f"{kind}.{group}"
    joined = ", ".join(str(c) for c in causes)
    if len(causes) > 1:
        joined = "[" + joined + "]"
    return APIError(
        422,
        f'{qualified} "{name}" is invalid: {joined}',
        details=details_of(name, group, kind, causes=[c.as_dict() for c in causes]),
    )
