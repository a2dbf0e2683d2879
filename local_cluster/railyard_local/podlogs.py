"""Serving a container's log file: what both the embedded API server's ``pods/log`` and the node
agent's kubelet endpoint (``/containerLogs``, where a real API server reads logs) answer.

One reading of the options (``tailLines``, ``limitBytes``, ``follow``, ``previous``), as a
kubelet applies them to its log files; ``timestamps`` and ``sinceSeconds``/``sinceTime`` are
accepted and ignored (the files hold no per-line times).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

#: How often a followed log is checked for new output.
FOLLOW_POLL_S = 0.2


def log_file(log_dir: Path, namespace: str, pod: str, container: str, previous: bool = False) -> Path:
    """Where a container's log lives: ``<log_dir>/<ns>/<pod>/<container>.log`` (``.previous.log``:
    its run before the last restart). The node agent writes there; both servers read there."""
    return log_dir / namespace / pod / f"{container}{'.previous' if previous else ''}.log"


def pod_log_lines(log_dir: Path, namespace: str, pod: str) -> list[str]:
    """Every line a pod's containers printed, in the order of its log files (:func:`log_file`),
    from this machine's node agent logs: they are here whatever the pod's state now and whichever
    API server holds the pod (a real one cannot serve pods/log for them: it would ask a kubelet)."""
    folder = log_file(log_dir, namespace, pod, "x").parent
    files = sorted(folder.glob("*.log")) if folder.exists() else []
    return [line for f in files for line in f.read_text(errors="replace").splitlines()]


def pod_events(log_dir: Path, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The JSON lines of :func:`pod_log_lines` (the trainer's and its launcher's events)."""
    out: list[dict[str, Any]] = []
    for line in pod_log_lines(log_dir, namespace, pod):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


class LogOptionError(ValueError):
    """A query parameter that is not what it should be (answered 400)."""


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None


def _flag(q: Mapping[str, str], name: str) -> bool:
    return q.get(name) in ("1", "true")


def _int(q: Mapping[str, str], name: str) -> int | None:
    value = q.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise LogOptionError(f"{name} must be an integer, got {value!r}") from None


def parse_log_options(q: Mapping[str, str]) -> LogOptions:
    return LogOptions(follow=_flag(q, "follow"), previous=_flag(q, "previous"),
                      tail_lines=_int(q, "tailLines"), limit_bytes=_int(q, "limitBytes"))


def select(data: bytes, opts: LogOptions) -> bytes:
    """The part of a log the options ask for: the last ``tailLines`` lines, then at most
    ``limitBytes`` bytes."""
    if opts.tail_lines is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-opts.tail_lines:]) if opts.tail_lines > 0 else b""
    if opts.limit_bytes is not None:
        data = data[: opts.limit_bytes]
    return data


async def respond(
    request: web.Request,
    path: Path | None,
    opts: LogOptions,
    *,
    current: Callable[[], Path | None],
    done: Callable[[], bool],
    stopping: asyncio.Event,
) -> web.StreamResponse:
    """Answer with the log at ``path``; with ``follow``, keep sending what is appended to the
    current log (``current()``) until ``done()`` (the container ended or the pod is gone) or
    ``stopping``."""
    data = path.read_bytes() if path is not None and path.exists() else b""
    data = select(data, opts)
    if not opts.follow:
        return web.Response(body=data, content_type="text/plain")
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    await resp.write(data)
    offset = path.stat().st_size if path is not None and path.exists() else 0
    try:
        while not stopping.is_set():
            await asyncio.sleep(FOLLOW_POLL_S)
            path = current()
            if path is not None and path.exists():
                size = path.stat().st_size
                if size > offset:
                    with path.open("rb") as f:
                        f.seek(offset)
                        chunk = f.read(size - offset)
                    offset = size
                    await resp.write(chunk)
                    continue
            if done():
                break
    except (ConnectionResetError, RuntimeError):
        pass
    return resp
