"""``railyard logs JOB``: the logs of a TrainingJob's gang, each line prefixed with its pod and ranks.

Reads the pods still there (the running gang, or a finished job's kept pods, see
``spec.cleanup``) through the API server's ``pods/log``, as ``kubectl logs`` does, so it works on
any cluster and on the local one. By default: every pod of the newest attempt that has pods, one
after the other (``-f``: all at once, interleaved by line, until every container has stopped).
The ranks of each pod come from the attempt's rank table (ConfigMap ``<job>-a<attempt>``).
When no pod is left, it says so and shows ``status.lastFailure``, the failing rank's last words
that the operator kept; a job whose pods have not started yet says what it is doing instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from railyard.logic.gang import pod_name_of
from railyard.logic.manifests import (
    ATTEMPT_LABEL,
    CLEANUP_LABEL,
    CONTAINER_NAME,
    JOB_LABEL,
    POD_INDEX_LABEL,
    RANK_TABLE_FILE,
    configmap_name,
)
from railyard.protocol.ranktable import RankTable


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "logs", help="print a TrainingJob's logs, every line prefixed with its pod and ranks",
        description="Print the logs of a TrainingJob's pods (the newest attempt by default), each line "
        "prefixed with [pod ranks]. Finished pods stay for spec.cleanup.ttlSecondsAfterFinished.",
    )
    p.add_argument("job", help="TrainingJob name")
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else default)")
    p.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG or ~/.kube/config, else in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, help="only the pod that runs this global rank")
    which.add_argument("--pod", help="only this pod (its name, or its index in the gang)")
    p.add_argument("--attempt", type=int, help="this attempt's pods (default: the newest attempt with pods)")
    p.add_argument("-f", "--follow", action="store_true", help="stream the logs until every container has stopped")
    p.add_argument("--previous", action="store_true",
                   help="the previous instance of each pod's trainer container (where it was restarted in place)")
    p.add_argument("--tail", type=int, help="only the last N lines of each pod")


# --------------------------------------------------------------------------- pure helpers


@dataclass(frozen=True, slots=True)
class Source:
    pod: str
    index: int
    ranks: tuple[int, ...]

    @property
    def prefix(self) -> str:
        return f"[{self.pod} {format_ranks(self.ranks)}] " if self.ranks else f"[{self.pod}] "


def format_ranks(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0-3`` (consecutive) or ``ranks 0,2,4``."""
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ",".join(str(r) for r in rs)


def _label(pod: Mapping[str, Any], key: str) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(key, ""))


def _int(text: str, default: int = -1) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def gang_pods(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The gang's own pods (not its checkpoint-cleanup pods)."""
    return [p for p in pods if _label(p, CLEANUP_LABEL) != "true"]


def choose_attempt(pods: Sequence[Mapping[str, Any]], wanted: int | None) -> int | None:
    """The attempt to show: ``wanted``, else the newest one that has pods (None: no pods)."""
    attempts = {_int(_label(p, ATTEMPT_LABEL)) for p in pods}
    if wanted is not None:
        return wanted
    return max(attempts) if attempts else None


def build_sources(
    pods: Sequence[Mapping[str, Any]],
    attempt: int,
    table: RankTable | None,
    *,
    rank: int | None = None,
    pod: str | None = None,
) -> list[Source]:
    """The pods of ``attempt`` to read, by pod index, with their ranks; narrowed to the pod of
    ``rank`` or to ``pod`` (a name or an index). Raises ValueError naming what is missing."""
    ranks_of: dict[int, tuple[int, ...]] = {}
    if table is not None:
        for e in table.ranks:
            ranks_of[e.pod_index] = (*ranks_of.get(e.pod_index, ()), e.rank)
    mine = [p for p in pods if _int(_label(p, ATTEMPT_LABEL)) == attempt]
    out = sorted(
        (Source(pod_name_of(p), _int(_label(p, POD_INDEX_LABEL)), ranks_of.get(_int(_label(p, POD_INDEX_LABEL)), ()))
         for p in mine),
        key=lambda s: (s.index, s.pod),
    )
    if rank is not None:
        if table is None:
            raise ValueError(f"--rank {rank}: the rank table of attempt {attempt} is gone; choose a pod with --pod")
        out = [s for s in out if rank in s.ranks]
        if not out:
            raise ValueError(f"--rank {rank}: no pod of attempt {attempt} that runs it is left")
    if pod is not None:
        out = [s for s in out if s.pod == pod or str(s.index) == pod]
        if not out:
            names = ", ".join(sorted(pod_name_of(p) for p in mine)) or "none"
            raise ValueError(f"--pod {pod}: no such pod in attempt {attempt} (its pods: {names})")
    return out


def prefixed(prefix: str, text: str) -> str:
    """Every line of ``text`` with ``prefix`` (a last line without a newline gets one)."""
    if not text:
        return ""
    return "".join(prefix + line + ("" if line.endswith("\n") else "\n") for line in text.splitlines(keepends=True))


def describe_last_failure(status: Mapping[str, Any]) -> str:
    last = status.get("lastFailure") or {}
    if not last:
        return ""
    where = ", ".join(f"{k} {last[k]}" for k in ("pod", "node") if last.get(k))
    head = f"last failure (attempt {last.get('attempt', 0)}): {last.get('reason', '')}"
    if last.get("exitCode") is not None:
        head += f", exit code {last['exitCode']}"
    if where:
        head += f" ({where})"
    message = str(last.get("message") or "").rstrip()
    return head + ("\n" + prefixed("  ", message) if message else "\n")


#: The condition that carries the reason of each phase (as ``status.phase``'s headline).
_PHASE_CONDITION = {"Placing": "Placed", "Starting": "Placed", "Restarting": "Restarting", "Suspended": "Suspended",
                    "Succeeded": "Succeeded", "Failed": "Failed"}


def describe_no_pods(status: Mapping[str, Any], job: str, *, attempt: int | None = None) -> str:
    """What is true of a job without pods to read (``attempt``: the one asked for): a finished
    job's pods are gone after ``spec.cleanup``; a job that has not started (or is between
    attempts, or suspended) has none yet, and says what it is doing."""
    phase = str(status.get("phase") or "Pending")
    if phase in ("Succeeded", "Failed"):
        which = f"of attempt {attempt} " if attempt is not None else ""
        return (
                   f"no pods {which}of {job} are left (a finished job keeps its pods for "
                   "spec.cleanup.ttlSecondsAfterFinished)\n"
               )
    if attempt is not None and attempt != int(status.get("attempt") or 0):
        return (
                   f"no pods of attempt {attempt} of {job} are left (the job is {phase}, at attempt "
                   f"{int(status.get('attempt') or 0)})\n"
               )
    reason = next(
        (
            str(c.get("reason") or "")
            for c in status.get("conditions") or ()
            if c.get("type") == _PHASE_CONDITION.get(phase)
        ),
        "",
    )
    message = str(status.get("message") or "")
    why = f" ({reason}: {message})" if reason and message else f" ({reason or message})" if reason or message else ""
    when = "once it is resumed and its pods start" if phase == "Suspended" else "once its pods start"
    now = "now" if phase == "Restarting" else "yet"
    return f"{job} has no pods {now}: it is {phase}{why}; its logs appear {when}\n"


# --------------------------------------------------------------------------- the cluster


def _client(args: argparse.Namespace) -> tuple[Any, str]:
    k8s: Any = importlib.import_module("kubernetes")
    namespace = args.namespace
    try:
        api_client = k8s.config.new_client_from_config(config_file=args.kubeconfig, context=args.context)
        if namespace is None:
            _, active = k8s.config.list_kube_config_contexts(config_file=args.kubeconfig)
            if args.context:
                contexts, _ = k8s.config.list_kube_config_contexts(config_file=args.kubeconfig)
                active = next((c for c in contexts if c.get("name") == args.context), active)
            namespace = ((active or {}).get("context") or {}).get("namespace")
    except k8s.config.ConfigException:
        if args.kubeconfig:
            raise
        k8s.config.load_incluster_config()
        api_client = k8s.client.ApiClient()
    return k8s.client.CoreV1Api(api_client), namespace or "default"


def _read_table(core: Any, namespace: str, job: str, attempt: int) -> RankTable | None:
    k8s: Any = importlib.import_module("kubernetes")
    try:
        cm = core.read_namespaced_config_map(configmap_name(job, attempt), namespace)
    except k8s.client.exceptions.ApiException:
        return None
    try:
        return RankTable.from_json((cm.data or {}).get(RANK_TABLE_FILE, ""))
    except ValueError:
        return None


def _job_status(core: Any, namespace: str, job: str) -> dict[str, Any] | None:
    k8s: Any = importlib.import_module("kubernetes")
    custom = k8s.client.CustomObjectsApi(core.api_client)
    try:
        body = custom.get_namespaced_custom_object("railyard.dev", "v1alpha1", namespace, "trainingjobs", job)
    except k8s.client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(body.get("status") or {})


def _error_text(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "reason", exc))


def _log_params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"container": CONTAINER_NAME}
    if args.previous:
        params["previous"] = True
    if args.tail is not None:
        params["tail_lines"] = args.tail
    return params


def _print_all(
    core: Any, namespace: str, sources: Sequence[Source], args: argparse.Namespace, out: Callable[[str], None]
) -> int:
    k8s: Any = importlib.import_module("kubernetes")
    failed = 0
    for s in sources:
        try:
            text = core.read_namespaced_pod_log(s.pod, namespace, **_log_params(args))
        except k8s.client.exceptions.ApiException as exc:
            print(f"railyard logs: {s.pod}: {_error_text(exc)}", file=sys.stderr)
            failed += 1
            continue
        out(prefixed(s.prefix, str(text or "")))
    return 1 if failed else 0


def _follow_all(
    core: Any, namespace: str, sources: Sequence[Source], args: argparse.Namespace, out: Callable[[str], None]
) -> int:
    k8s: Any = importlib.import_module("kubernetes")
    lock = threading.Lock()
    failed: list[str] = []

    def follow(s: Source) -> None:
        try:
            resp = core.read_namespaced_pod_log(
                s.pod, namespace, follow=True, _preload_content=False, **_log_params(args)
            )
        except k8s.client.exceptions.ApiException as exc:
            with lock:
                print(f"railyard logs: {s.pod}: {_error_text(exc)}", file=sys.stderr)
                failed.append(s.pod)
            return
        pending = b""
        try:
            for chunk in resp.stream(4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if lines:
                    text = "".join(ln.decode("utf-8", "replace") + "\n" for ln in lines)
                    with lock:
                        out(prefixed(s.prefix, text))
            if pending:
                with lock:
                    out(prefixed(s.prefix, pending.decode("utf-8", "replace")))
        finally:
            resp.release_conn()

    threads = [threading.Thread(target=follow, args=(s,), daemon=True, name=f"logs-{s.pod}") for s in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    try:
        core, namespace = _client(args)
    except Exception as exc:  # the kubeconfig loaders raise several kinds
        print(f"railyard logs: cannot reach the cluster ({exc}); check --kubeconfig/--context", file=sys.stderr)
        return 1
    k8s: Any = importlib.import_module("kubernetes")
    try:
        listed = core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={args.job}")
    except k8s.client.exceptions.ApiException as exc:
        print(f"railyard logs: listing the pods of {namespace}/{args.job}: {_error_text(exc)}", file=sys.stderr)
        return 1
    pods = gang_pods(core.api_client.sanitize_for_serialization(p) for p in listed.items)
    attempt = choose_attempt(pods, args.attempt)
    sources: list[Source] = []
    if attempt is not None:
        try:
            sources = build_sources(
                pods, attempt, _read_table(core, namespace, args.job, attempt), rank=args.rank, pod=args.pod
            )
        except ValueError as exc:
            print(f"railyard logs: {exc}", file=sys.stderr)
            return 1
    if not sources:
        status = _job_status(core, namespace, args.job)
        if status is None:
            print(f"railyard logs: no TrainingJob {namespace}/{args.job}", file=sys.stderr)
            return 1
        sys.stderr.write("railyard logs: " + describe_no_pods(status, f"{namespace}/{args.job}", attempt=args.attempt))
        said = describe_last_failure(status)
        if said:
            sys.stderr.write(said)
        return 1
    try:
        if args.follow:
            return _follow_all(core, namespace, sources, args, out)
        return _print_all(core, namespace, sources, args, out)
    except KeyboardInterrupt:
        return 130
