"""The restart control channel's operator end: the board of what each job's launchers are told,
and the long-poll route they ask on (``POST /v1/control/{namespace}/{job}``, protocol in
railyard.protocol.control, docs/operator.md "Restarting in place").

The reconcile cycle publishes, per job, the current attempt, the member pod of each index, the
attempt's rank table and restore hint (:meth:`ControlBoard.publish`); each launcher's report is
kept (:meth:`ControlBoard.reports`, the evidence the cycle reads) and answered by
:func:`railyard.logic.inplace.decide_control_answer`. A launcher with nothing to do is held until
the job's state changes or its ``wait`` runs out, so a restart order reaches every waiting
launcher as soon as it is published. Nothing here decides anything.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from railyard.logic.inplace import GangControl, decide_control_answer
from railyard.logic.jitsave import SaveOrder, answer_save
from railyard.logic.layout import build_replica_group_table
from railyard.logic.manifests import rendezvous_port
from railyard.protocol.control import (
    MAX_REPORT_BYTES,
    MAX_WAIT_S,
    ROUTE,
    Action,
    ControlError,
    ControlOrder,
    LauncherReport,
    LauncherState,
    build_rank_table_delta,
    parse_report,
)
from railyard.protocol.mesh import group_of_pod_index, pods_per_group
from railyard.protocol.ranktable import RankTable

log = logging.getLogger(__name__)

Key = tuple[str, str]
#: Rank tables kept per job (a kept launcher may still run an older attempt's table).
TABLES_KEPT = 8


@dataclass
class _Job:
    gang: GangControl | None = None
    tables: dict[int, RankTable] = field(default_factory=dict)
    restore: dict[str, Any] | None = None
    reports: dict[int, tuple[LauncherReport, float]] = field(default_factory=dict)
    #: (from-attempt, replica group) -> the restart order's JSON (one delta per launcher attempt
    #: and group, not per launcher)
    orders: dict[tuple[int, int], bytes] = field(default_factory=dict)
    #: faultTolerance ReplicaGroups: the launchers run their group's table, so their restart
    #: orders carry a delta between group tables
    replicas: int = 1
    #: a just-in-time save asked of the current attempt's launchers (logic/jitsave.py)
    save: SaveOrder | None = None
    #: resolved (and replaced) when the job's control state changes; every held poll waits on it
    changed: asyncio.Future[None] | None = None


class ControlBoard:
    """Per job: what the operator has published and what the launchers reported."""

    def __init__(
        self, *, on_report: Callable[[str, str], None] | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.jobs: dict[Key, _Job] = {}
        self.on_report = on_report
        self.clock = clock
        self.closed = False

    def close(self) -> None:
        """Answer every held poll now (the operator is shutting down)."""
        self.closed = True
        for j in self.jobs.values():
            self._changed(j)

    # -- the reconcile side
    def publish(
        self,
        namespace: str,
        job: str,
        *,
        attempt: int,
        members: Mapping[int, str],
        table: RankTable | None = None,
        restore: Mapping[str, Any] | None = None,
        open_: bool = True,
        waiting: str = "",
        carry_on: Iterable[int] = (),
        replica_groups: int | None = None,
    ) -> None:
        """Say what attempt ``attempt`` is: its member pods, rank table and restore hint.
        ``open_`` False holds restart orders back (the launchers of the failed attempt wait).
        ``carry_on``: pod indices whose launchers keep their older attempt (a replica-group
        repair), never told to restart. ``replica_groups``: the job's replica groups (None: as
        published before)."""
        j = self.jobs.setdefault((namespace, job), _Job())
        if replica_groups is not None:
            j.replicas = replica_groups
        new = GangControl(
            attempt=attempt, members=dict(members), open=open_, waiting=waiting, carry_on=frozenset(carry_on)
        )
        if table is not None:
            j.tables[attempt] = table
            for old in sorted(j.tables)[:-TABLES_KEPT]:
                del j.tables[old]
        if restore is not None or (j.gang is not None and j.gang.attempt != attempt):
            j.restore = None if restore is None else dict(restore)
        if j.gang is None or j.gang.attempt != attempt or j.gang.open != open_:
            j.orders.clear()
        if j.save is not None and j.save.attempt != attempt:
            j.save = None  # a save order is for the attempt it names only
        if new != j.gang:
            j.gang = new
            self._changed(j)

    def order_save(self, namespace: str, job: str, order: SaveOrder) -> None:
        """Ask the launchers of ``order.attempt`` for a just-in-time save (answered once to each,
        until a new attempt is published)."""
        j = self.jobs.setdefault((namespace, job), _Job())
        if j.save != order:
            j.save = order
            self._changed(j)

    def withdraw_save(self, namespace: str, job: str) -> None:
        """No move is coming any more (the node was uncordoned): ask no launcher for the save."""
        j = self.jobs.get((namespace, job))
        if j is not None:
            j.save = None

    def save_order(self, namespace: str, job: str) -> SaveOrder | None:
        j = self.jobs.get((namespace, job))
        return None if j is None else j.save

    def finish(self, namespace: str, job: str, reason: str) -> None:
        j = self.jobs.get((namespace, job))
        if j is not None and j.gang is not None and not j.gang.finished:
            j.gang = replace(j.gang, finished=reason)
            self._changed(j)

    def forget(self, namespace: str, job: str) -> None:
        j = self.jobs.pop((namespace, job), None)
        if j is not None:
            self._changed(j)

    def get(self, namespace: str, job: str) -> GangControl | None:
        j = self.jobs.get((namespace, job))
        return None if j is None else j.gang

    def table(self, namespace: str, job: str, attempt: int) -> RankTable | None:
        j = self.jobs.get((namespace, job))
        return None if j is None else j.tables.get(attempt)

    def reports(self, namespace: str, job: str) -> dict[int, tuple[LauncherReport, float]]:
        """Pod index -> (the latest report of that index's launcher, when it arrived)."""
        j = self.jobs.get((namespace, job))
        return {} if j is None else dict(j.reports)

    # -- the launchers' side
    def record(self, namespace: str, job: str, report: LauncherReport) -> None:
        """Keep the report; wake the job's reconcile when it says something the cycle must act
        on at once (workers failed, stopped or done), not for every poll, and not for each of
        2,047 launchers saying they run the new attempt (the cycle that waits for them looks
        again within a second)."""
        j = self.jobs.setdefault((namespace, job), _Job())
        old = j.reports.get(report.pod_index)
        j.reports[report.pod_index] = (report, self.clock())
        news = old is None or (old[0].pod, old[0].attempt, old[0].state, old[0].code) != (
            report.pod,
            report.attempt,
            report.state,
            report.code,
        )
        if news and report.state is not LauncherState.RUNNING and self.on_report is not None:
            self.on_report(namespace, job)

    def answer(self, namespace: str, job: str, report: LauncherReport) -> tuple[ControlOrder | bytes, Action]:
        """The order for ``report`` (restart orders as cached JSON bytes)."""
        j = self.jobs.get((namespace, job))
        if j is None or j.gang is None:
            return ControlOrder(
                job, report.attempt, Action.CONTINUE, "the operator has not published this job yet"
            ), Action.CONTINUE
        action, reason = decide_control_answer(j.gang, report)
        if (
            action is Action.CONTINUE
            and j.save is not None
            and j.gang.attempt == j.save.attempt
            and answer_save(j.save, report)
        ):
            save = j.save
            return ControlOrder(
                job,
                save.attempt,
                Action.SAVE,
                f"save before {save.before}",
                save_step=save.step,
            ), Action.SAVE
        if action is not Action.RESTART:
            return ControlOrder(job, j.gang.attempt, action, reason), action
        new = j.tables.get(j.gang.attempt)
        base = j.tables.get(report.attempt)
        group = 0
        if j.replicas > 1 and new is not None and len(new.pods) % j.replicas == 0:
            # the launcher runs its replica group's world: the delta is between group tables
            group = group_of_pod_index(report.pod_index, pods_per_group(len(new.pods), j.replicas))
            new = build_replica_group_table(new, group=group, replicas=j.replicas,
                                            master_port=rendezvous_port(job, namespace, j.gang.attempt, group))
            if base is not None:
                base = build_replica_group_table(base, group=group, replicas=j.replicas,
                                                 master_port=rendezvous_port(job, namespace, report.attempt, group))
        cached = j.orders.get((report.attempt, group))
        if cached is None:
            delta = build_rank_table_delta(base, new) if base is not None and new is not None else None
            order = ControlOrder(job, j.gang.attempt, Action.RESTART, reason, delta=delta,
                                 rank_table=None if delta is not None else new, restore=j.restore)
            if delta is None and new is None:
                # nothing to restart with yet (an operator that has not re-read the attempt's
                # ConfigMap): wait
                return ControlOrder(
                    job, j.gang.attempt, Action.CONTINUE, "the new attempt's rank table is not loaded yet"
                ), Action.CONTINUE
            cached = order.to_json().encode()
            j.orders[(report.attempt, group)] = cached
        return cached, action

    async def wait_change(self, namespace: str, job: str, timeout: float) -> None:
        """Until the job's control state changes or ``timeout``. One shared future per job and
        no task per waiter: 2,048 held polls wake in one pass of the loop."""
        j = self.jobs.setdefault((namespace, job), _Job())
        if j.changed is None or j.changed.done():
            j.changed = asyncio.get_running_loop().create_future()
        await asyncio.wait((j.changed,), timeout=timeout)

    def _changed(self, j: _Job) -> None:
        if j.changed is not None and not j.changed.done():
            j.changed.set_result(None)
        j.changed = None


TokenLookup = Callable[[str, str], Any]


def _refuse(status: int, message: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="railyard"'} if status == 401 else None
    return web.json_response({"error": message}, status=status, headers=headers)


def build_control_handler(
    board: ControlBoard, token_for: TokenLookup, *, clock: Callable[[], float] = time.monotonic
) -> Callable[[web.Request], Any]:
    """The long-poll handler (same authentication as the heartbeat ingest)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        namespace, job = request.match_info["namespace"], request.match_info["job"]
        if request.content_length is not None and request.content_length > MAX_REPORT_BYTES:
            return _refuse(413, f"body: {request.content_length} bytes is over the {MAX_REPORT_BYTES} byte limit")
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _refuse(401, "Authorization: expected 'Bearer <job token>' (the token from the job's Secret)")
        expected = token_for(namespace, job)
        if inspect.isawaitable(expected):
            expected = await expected
        if expected is None:
            return _refuse(404, f"job {namespace}/{job} is not known to this operator")
        if not hmac.compare_digest(token.encode(), str(expected).encode()):
            return _refuse(403, f"Authorization: the token is not {namespace}/{job}'s")
        try:
            body = await request.content.read(MAX_REPORT_BYTES + 1)
        except ConnectionResetError:
            return _refuse(400, "body: the connection closed before the body arrived")
        if len(body) > MAX_REPORT_BYTES:
            return _refuse(413, f"body: over the {MAX_REPORT_BYTES} byte limit")
        try:
            report = parse_report(body)
        except ControlError as exc:
            return _refuse(400, str(exc))
        if report.job != job:
            return _refuse(400, f"job: the report names {report.job!r} but the URL names {job!r}")
        try:
            wait = min(max(float(request.query.get("wait", "0")), 0.0), MAX_WAIT_S)
        except ValueError:
            return _refuse(400, f"wait: {request.query.get('wait')!r} is not a number of seconds")
        board.record(namespace, job, report)
        deadline = clock() + wait
        while True:
            order, action = board.answer(namespace, job, report)
            left = deadline - clock()
            if action is not Action.CONTINUE or left <= 0 or board.closed:
                break
            await board.wait_change(namespace, job, left)
        payload = order if isinstance(order, bytes) else order.to_json().encode()
        return web.Response(body=payload, content_type="application/json")

    return handle


def add_control_routes(app: web.Application, board: ControlBoard, token_for: TokenLookup) -> None:
    app.router.add_post(ROUTE, build_control_handler(board, token_for))
