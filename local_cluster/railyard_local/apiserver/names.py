"""Name rules of apimachinery (DNS-1123 subdomains, label names, qualified names) with the
messages kube-apiserver gives, shared by the embedded server's validators."""

from __future__ import annotations

import re

from .errors import Cause, invalid_value

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

QUALIFIED_NAME_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                       "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                       "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def qualified_name(value: str, path: str) -> list[Cause]:
    """apimachinery's IsQualifiedName: ``[prefix/]name``."""
    out: list[Cause] = []
    parts = value.split("/")
    name = parts[-1]
    if len(parts) > 2:
        return [invalid_value(path, value, "a qualified name must consist of alphanumeric characters, '-', '_' or "
                              "'.', and must start and end with an alphanumeric character (e.g. 'MyName',  or "
                              "'my.name',  or '123-abc', regex used for validation is "
                              "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix "
                              "and '/' (e.g. 'example.com/MyName')")]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            out.append(invalid_value(path, value, "prefix part must be non-empty"))
        elif len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix):
            out.append(invalid_value(path, value, "prefix part a lowercase RFC 1123 subdomain must consist of lower "
                                     "case alphanumeric characters, '-' or '.', and must start and end with an "
                                     "alphanumeric character (e.g. 'example.com', regex used for validation is "
                                     "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"))
    if not name:
        out.append(invalid_value(path, value, "name part must be non-empty"))
    elif len(name) > 63:
        out.append(invalid_value(path, value, "name part must be no more than 63 characters"))
    if not LABEL_NAME.match(name):
        out.append(invalid_value(path, value, QUALIFIED_NAME_MSG))
    return out
