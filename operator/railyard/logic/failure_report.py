"""The failing rank's last words: which pod failed first, where, with what exit code and what
it said, for the job's status (``status.lastFailure``), its Restarting/Failed condition and
its Event. The pods of a failed attempt are deleted at the restart; this is what survives.

What a pod "said" is its trainer container's termination message: the trainer's launcher writes
the failing worker's error to ``/dev/termination-log``, and for any other program the kubelet
falls back to the last lines of its log (``terminationMessagePolicy: FallbackToLogsOnError``,
at most 80 lines / 2 KiB). Pure: pods in, a report out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import LastFailure
from railyard.logic.conditions import parse_time
from railyard.logic.failures import Failure, classify_pod
from railyard.logic.gang import pod_index_of, pod_name_of
from railyard.logic.manifests import CONTAINER_NAME

Pod = Mapping[str, Any]

#: Longest ``status.lastFailure.message`` (the tail of the termination message, lines kept).
MAX_MESSAGE_CHARS = 1024
#: Longest quote of the last words in a condition message or an Event (one line).
MAX_QUOTE_CHARS = 300
#: At most this many of the last lines are quoted (a traceback's last line is the exception).
MAX_QUOTE_LINES = 3



def _terminated(pod: Pod) -> Mapping[str, Any] | None:
    """The trainer container's terminated state (else the first container's that failed)."""
    statuses = list((pod.get("status") or {}).get("containerStatuses") or ())
    ordered = sorted(statuses, key=lambda cs: cs.get("name") != CONTAINER_NAME)
    terms = [((cs.get("state") or {}).get("terminated") or {}) for cs in ordered]
    terms = [t for t in terms if t]
    for t in terms:
        if int(t.get("exitCode", 0) or 0) != 0:
            return t
    return terms[0] if terms else None


def _finished_at(pod: Pod) -> float:
    t = _terminated(pod)
    at = parse_time(str((t or {}).get("finishedAt") or ""))
    return at if at is not None else float("inf")


def pick_first_failing_pod(
    failure: Failure, pods: Sequence[Pod], nodes: Mapping[str, Mapping[str, Any]]
) -> tuple[Pod, Failure] | None:
    """The pod that explains ``failure`` (the root cause that :func:`decide_root_failure` chose)
    and its own failure: among the pods showing the same kind of failure, the one whose container
    exited first (ties: the root's own pod, then by name). None when no pod shows it (a verdict
    from heartbeats)."""
    same = [(p, f) for p in pods if (f := classify_pod(p, nodes)) is not None and f.kind == failure.kind]
    if not same:
        return None
    return min(same, key=lambda pf: (_finished_at(pf[0]), pod_name_of(pf[0]) != failure.pod, pod_name_of(pf[0])))


def tail_of(message: str, max_chars: int = MAX_MESSAGE_CHARS) -> str:
    """The end of a termination message, cut at a line start when it has to be cut."""
    text = message.strip()
    if len(text) <= max_chars:
        return text
    cut = text[-max_chars:]
    nl = cut.find("\n")
    return cut[nl + 1:] if 0 <= nl < len(cut) - 1 else cut


#: A Python warning as the warnings module prints it ("path.py:12: UserWarning: text"); the
#: module prints the warning's source line under it, indented (``  warnings.warn(``).
_WARNING = re.compile(r"^\S.*:\d+: [A-Z]\w*Warning: ")
#: A line that names an error: an exception as a traceback ends ("torch.distributed.DistBackendError:
#: ..."), or a log line at level ERROR.
_ERROR = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b|\bERROR\b")


def pick_lines_that_say_something(message: str) -> list[str]:
    """The non-empty lines of ``message`` worth quoting, stripped: the library warnings a log
    tail is often full of (a torch UserWarning and its source line) are left out, and when a
    line names an error the lines end with the last such line (what a traceback or the
    trainer's events before and after it say). All lines when nothing else is left."""
    lines = message.strip().splitlines()
    said: list[str] = []
    after_warning = False
    for line in lines:
        if _WARNING.match(line):
            after_warning = True
            continue
        if after_warning and line[:1].isspace():  # the warning's source line
            after_warning = False
            continue
        after_warning = False
        if line.strip():
            said.append(line.strip())
    if not said:
        return [ln.strip() for ln in lines if ln.strip()]
    errors = [i for i, line in enumerate(said) if _ERROR.search(line)]
    return said[: errors[-1] + 1] if errors else said


def quote_last_words(message: str, *, max_lines: int = MAX_QUOTE_LINES, max_chars: int = MAX_QUOTE_CHARS) -> str:
    """The last lines that say something (:func:`pick_lines_that_say_something`) of
    ``message`` on one line (`` | `` between them), at most ``max_chars``: what a condition
    message or an Event can show."""
    lines = pick_lines_that_say_something(message)
    picked: list[str] = []
    used = 0
    for line in reversed(lines[-max_lines:]):
        cost = len(line) + (3 if picked else 0)
        if picked and used + cost > max_chars:
            break
        picked.insert(0, line)
        used += cost
    text = " | ".join(picked)
    return text if len(text) <= max_chars else "..." + text[-(max_chars - 3):]


def explain_failure(
    failure: Failure,
    pods: Sequence[Pod],
    nodes: Mapping[str, Mapping[str, Any]],
    *,
    attempt: int,
    time: str,
) -> tuple[Failure, LastFailure]:
    """``failure`` told about its first failing pod (the nodes to blame stay the root's), and
    ``status.lastFailure`` for it, among the pods of ``attempt``."""
    picked = pick_first_failing_pod(failure, pods, nodes)
    if picked is None:
        return failure, LastFailure(
            attempt=attempt, reason=failure.kind, node=failure.nodes[0] if failure.nodes else "", time=time
        )
    pod, own = picked
    term = _terminated(pod) or {}
    code = term.get("exitCode")
    index = pod_index_of(pod)
    report = LastFailure(
        attempt=attempt,
        reason=failure.kind,
        pod=pod_name_of(pod),
        pod_index=index if index >= 0 else None,
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        exit_code=int(code) if code is not None else None,
        message=tail_of(str(term.get("message") or "")),
        time=time,
    )
    return dataclasses.replace(failure, message=own.message, pod=own.pod), report


def describe_failure(failure: Failure, report: LastFailure) -> str:
    """One line for the condition and the Event: the failure, where, and its last words."""
    text = failure.message
    if report.pod and report.pod not in text:
        text += f" in {report.pod}"
    if report.node and report.node not in text:
        text += f" on node {report.node}"
    words = quote_last_words(report.message)
    if words:
        text += f': "{words}"'
    return text
