"""Name resolution for pod processes of the local cluster (installed as ``sitecustomize``).

The node agent copies this file as ``sitecustomize.py`` into a folder it puts first on each pod
process's ``PYTHONPATH``. Python imports it at start-up; it makes ``socket.getaddrinfo``,
``gethostbyname`` and ``gethostbyname_ex`` consult the hosts file named by
``RAILYARD_HOSTS_FILE`` (lines ``IP NAME...``, kept up to date by the agent) before the system
resolver, so ``trainer-0.trainers.default.svc`` resolves to that pod's node address without any
change to ``/etc/hosts``. Stand-alone on purpose: it must not import railyard.
"""

from __future__ import annotations

import os
import socket
from typing import Any

_PATH = os.environ.get("RAILYARD_HOSTS_FILE", "")
_cache: dict[str, list[str]] = {}
_stamp: tuple[int, int] = (-1, -1)
_orig_getaddrinfo = socket.getaddrinfo
_orig_gethostbyname = socket.gethostbyname
_orig_gethostbyname_ex = socket.gethostbyname_ex


def _table() -> dict[str, list[str]]:
    global _cache, _stamp
    try:
        st = os.stat(_PATH)
    except OSError:
        return _cache
    stamp = (st.st_mtime_ns, st.st_size)
    if stamp != _stamp:
        fresh: dict[str, list[str]] = {}
        try:
            with open(_PATH, encoding="utf-8") as fh:
                for line in fh:
                    parts = line.split("#", 1)[0].split()
                    for name in parts[1:]:
                        fresh.setdefault(name.lower(), []).append(parts[0])
        except OSError:
            return _cache
        _cache, _stamp = fresh, stamp
    return _cache


def lookup(host: Any) -> list[str]:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str) or not host:
        return []
    return _table().get(host.rstrip(".").lower(), [])


def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0) -> Any:
    ips = lookup(host)
    if ips and family in (0, socket.AF_INET):
        out: list[Any] = []
        for ip in ips:
            out.extend(_orig_getaddrinfo(ip, port, family, type, proto, flags))
        return out
    return _orig_getaddrinfo(host, port, family, type, proto, flags)


def gethostbyname(host: str) -> str:
    ips = lookup(host)
    return ips[0] if ips else _orig_gethostbyname(host)


def gethostbyname_ex(host: str) -> tuple[str, list[str], list[str]]:
    ips = lookup(host)
    return (host, [], list(ips)) if ips else _orig_gethostbyname_ex(host)


if _PATH:
    socket.getaddrinfo = getaddrinfo
    socket.gethostbyname = gethostbyname
    socket.gethostbyname_ex = gethostbyname_ex
