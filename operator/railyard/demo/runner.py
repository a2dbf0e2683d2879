"""Run the demo: local cluster, CRD, operator, the TrainingJob, the fault scenario, the summary.

Everything this starts lives in child processes of this one (cluster, operator, pods); a
``finally`` stops them, so Ctrl-C leaves nothing running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from railyard.demo.groups import (
    GroupRecord,
    GroupReport,
    PodSeen,
    build_group_report,
    format_group_report,
    group_record_to_json,
)
from railyard.demo.plots import draw_all
from railyard.demo.prometheus import (
    EXAMPLE_QUERIES,
    RULES_FILE,
    Prometheus,
    PrometheusError,
    build_report,
    graph_url,
    start_prometheus,
)
from railyard.demo.record import (
    Decision,
    Record,
    Sample,
    Summary,
    describe_restart,
    format_summary,
    members_of,
    note_nodes,
    note_placement,
    note_pods,
    note_restart,
    placement_picture,
    restores_from_status,
    summarise,
)
from railyard.demo.scenario import Scenario
from railyard.protocol.ports import free_port as _free_port

GROUP, VERSION, PLURAL = "railyard.dev", "v1alpha1", "trainingjobs"
DONE = ("Succeeded", "Failed")


class DemoError(RuntimeError):
    """The demo could not run; the message says why and where the logs are."""


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the operator goes when the demo goes, however the demo ends."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class Operator:
    """``railyard operator run`` as a child process in its own process group."""

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        self.port = _free_port()
        self.log = log
        argv = [
            sys.executable, "-m", "railyard", "operator", "run", "--standalone", "--namespace", "default",
            "--metrics-host", "127.0.0.1", "--metrics-port", str(self.port),
            "--heartbeat-advertise-url", f"http://127.0.0.1:{self.port}",
        ]
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            argv,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
            return str(resp.read().decode())

    def ready(self) -> bool:
        try:
            self.get("/healthz")
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def restarts_from_metrics(text: str) -> dict[str, int]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "railyard_restarts":
            for sample in family.samples:
                if sample.name == "railyard_restarts_total":
                    out[sample.labels.get("class", "")] = int(sample.value)
    return out


def _wait(what: str, pred: Callable[[], bool], timeout: float, log_hint: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}; see {log_hint}")
        time.sleep(0.2)


class Demo:
    def __init__(self, scenario: Scenario, out: Path, *, echo: Callable[[str], None] = print, timeout: float = 600.0,
                 prometheus: bool = False, prometheus_port: int = 0) -> None:
        scenario.validate()
        self.scenario = scenario
        self.out = out.absolute()
        self.echo = echo
        self.timeout = timeout
        self.job = scenario.training_job()
        self.name = self.job["metadata"]["name"]
        self.ns = self.job["metadata"]["namespace"]
        self.record = Record(started_at=0.0)
        self.status_history: list[dict[str, Any]] = []
        self.stragglers_seen: set[str] = set()
        self.done_actions: set[str] = set()
        self.seen_events: set[str] = set()
        self.metrics_restarts: dict[str, int] = {}
        #: start a real Prometheus beside the cluster (railyard.demo.prometheus)
        self.prometheus = prometheus
        self.prometheus_port = prometheus_port
        self.prometheus_report: dict[str, Any] | None = None
        #: --replica-groups: pods, UIDs, trainer events (railyard.demo.groups)
        self.groups = GroupRecord()
        self.group_report: GroupReport | None = None

    # ------------------------------------------------------------------ orchestration

    def run(self) -> Summary:
        from railyard_local.cluster import LocalCluster
        from railyard_local.podlogs import pod_events

        state = self.out / "cluster"
        if state.exists():
            shutil.rmtree(state)
        self.out.mkdir(parents=True, exist_ok=True)
        n = self.scenario.cluster_nodes
        self.echo(
            f"railyard demo: starting a local cluster of {n} simulated nodes x {self.scenario.procs_per_node} GPUs (1 "
            f"spine, 2 leaves) in {state}"
        )
        cluster = LocalCluster(state, nodes=n, gpus_per_node=self.scenario.procs_per_node, topology="spine=1,leaf=2")
        operator: Operator | None = None
        prom: Prometheus | None = None
        try:
            kubeconfig = cluster.start()
            self.echo(f"  kubeconfig: {kubeconfig}  (export KUBECONFIG={kubeconfig} to watch with kubectl)")
            self._clients(kubeconfig)
            self._install_crd()
            operator = Operator(kubeconfig, self.out / "operator.log")
            _wait("the operator", operator.ready, 60, str(operator.log))
            self.echo(f"  operator running (metrics on http://127.0.0.1:{operator.port}/metrics)")
            if self.prometheus:
                prom = self._start_prometheus(operator)
            self._read_topology()
            self.record.started_at = time.time()
            self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, self.job)
            self.echo(f"  applied TrainingJob {self.name}: {self._describe_job()}, {self.scenario.steps} steps")
            self._describe_scenario()
            self._watch(operator, cluster)
            if self.scenario.replica_groups is not None:
                self.groups.events = {name: pod_events(cluster.log_dir, self.ns, name) for name in self.groups.pods}
            try:
                self.metrics_restarts = restarts_from_metrics(operator.get("/metrics"))
            except OSError:
                self.metrics_restarts = {}
            if prom is not None:
                self._report_prometheus(prom)
        finally:
            if prom is not None:
                prom.stop()
            if operator is not None:
                operator.stop()
            cluster.stop()
        return self._finish()

    def _start_prometheus(self, operator: Operator) -> Prometheus:
        folder = self.out / "prometheus"
        if folder.exists():
            shutil.rmtree(folder)
        rules = [RULES_FILE] if RULES_FILE.exists() else []
        try:
            prom = start_prometheus(folder, [f"127.0.0.1:{operator.port}"], scrape_interval_s=2.0, rule_files=rules,
                                    port=self.prometheus_port)
        except PrometheusError as exc:
            raise DemoError(f"--prometheus: {exc}") from None
        self.echo(
            f"  prometheus: {prom.url}  (scrapes the operator every 2 s; "
            f"{'alerting rules ' + str(RULES_FILE) if rules else 'no rules file found'})"
        )
        self.echo(f"    alerts {prom.url}/alerts   targets {prom.url}/targets   try:")
        for expr in EXAMPLE_QUERIES:
            self.echo(f"    {expr:<45} {graph_url(prom.url, expr)}")
        return prom

    def _report_prometheus(self, prom: Prometheus) -> None:
        """What Prometheus saw, once it has scraped the final state (bounded wait)."""
        metric = {k.lower(): v for k, v in self.metrics_restarts.items() if v}
        end = time.time()
        try:
            report = prom.wait_until(
                "Prometheus to scrape the last restarts",
                lambda: (r := build_report(prom, self.record.started_at, time.time())).restarts == metric and r,
                15,
            )
        except PrometheusError:
            try:
                report = build_report(prom, self.record.started_at, end)
            except PrometheusError as exc:
                self.echo(f"  prometheus: {exc}; see {prom.log_file}")
                return
        self.prometheus_report = {
            "url": prom.url,
            "restarts": report.restarts,
            "restartsAgree": report.restarts == metric,
            "alertsFired": report.alerts_fired,
            "reopen": f"prometheus --config.file={prom.config_file} --storage.tsdb.path={prom.data_dir} "
                      "--web.listen-address=127.0.0.1:9090",
        }

    def _clients(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        # The typed client's models add nothing here: the demo reads plain dicts and a few fields.
        api_client: Any = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.ext: Any = client.ApiextensionsV1Api(api_client)

    def _install_crd(self) -> None:
        from kubernetes.client.exceptions import ApiException

        from railyard.api.crd import build_crd

        try:
            self.ext.create_custom_resource_definition(build_crd())
        except ApiException as exc:
            if exc.status != 409:
                raise
        _wait("the TrainingJob CRD", self._crd_served, 30, "the cluster logs")

    def _crd_served(self) -> bool:
        try:
            self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL)
            return True
        except Exception:
            return False

    def _read_topology(self) -> None:
        nodes = [
            {"metadata": {"name": n.metadata.name, "labels": n.metadata.labels or {}}}
            for n in self.core.list_node().items
        ]
        note_nodes(self.record, self.job, nodes)

    def _describe_job(self) -> str:
        s = self.scenario
        if s.replica_groups is not None:
            return (
                f"{s.replica_groups.groups} replica groups of {s.nodes // s.replica_groups.groups} pod x "
                f"{s.procs_per_node} ranks "
                "(FSDP inside each, HSDP across them; faultTolerance ReplicaGroups, minReplicas "
                f"{s.replica_groups.min_replicas}), "
                f"a Lighthouse pod"
            )
        return f"{s.nodes} nodes x {s.procs_per_node} ranks, tensor={s.tensor}, FSDP across nodes"

    def _describe_scenario(self) -> None:
        s = self.scenario
        parts = []
        if s.straggler:
            parts.append(
                f"slow pod {s.straggler.pod_index}'s node x{s.straggler.factor:g} from step {s.straggler.step}"
            )
        if s.node_failure:
            parts.append(f"fail pod {s.node_failure.pod_index}'s node at step {s.node_failure.step}")
        if s.bitflip:
            parts.append(
                f"flip a bit in rank {s.bitflip.rank}'s {s.bitflip.target} at step {s.bitflip.step} (attempt "
                f"{s.bitflip_attempt()})"
            )
        self.echo("  scenario: " + ("; ".join(parts) or "no faults"))

    # ------------------------------------------------------------------ watching

    def _watch(self, operator: Operator, cluster: Any) -> None:
        deadline = time.time() + self.timeout
        last_line = 0.0
        while True:
            now = time.time()
            if now > deadline:
                raise DemoError(
                    f"the job did not finish within {self.timeout:.0f} s; see {operator.log} and {cluster.log_dir}"
                )
            if operator.proc.poll() is not None:
                raise DemoError(f"the operator exited with {operator.proc.returncode}; see {operator.log}")
            broken = cluster.exited()
            if broken:
                raise DemoError(f"the local cluster's {broken} exited; see {cluster.log_dir}")
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, self.name)
            status: dict[str, Any] = obj.get("status") or {}
            self.status_history.append(status)
            sample = Sample(
                now,
                str(status.get("phase", "Pending")),
                int(status.get("attempt", 0)),
                int(status.get("step", 0)),
                status.get("loss"),
                float(status.get("tokensPerSecond", 0.0)),
            )
            changed_phase = not self.record.samples or (
                self.record.samples[-1].phase,
                self.record.samples[-1].attempt,
            ) != (sample.phase, sample.attempt)
            if self.record.add_sample(sample) and (changed_phase or now - last_line >= 2.0 or sample.phase in DONE):
                self.echo(self._progress_line(sample, status))
                last_line = now
            self._note_placement(status)
            self._note_restart(status)
            self._note_pods(status, sample.phase)
            for s in status.get("stragglers") or []:
                self.stragglers_seen.add(f"rank {s.get('rank')} on {s.get('node')}")
            self._print_events()
            self._act(sample, status)
            if sample.phase in DONE:
                self.record.final_status = status
                self.record.finished_at = now
                return
            time.sleep(0.5)

    def _progress_line(self, s: Sample, status: dict[str, Any]) -> str:
        restarts = (status.get("restarts") or {}).get("total", 0)
        loss = f"loss {s.loss:6.3f}" if isinstance(s.loss, int | float) else "loss    -  "
        ckpt = status.get("lastCheckpoint") or {}
        ck = f"ckpt {ckpt.get('tier')}@{ckpt.get('step')}" if ckpt else ""
        t = s.t - self.record.started_at
        return (
                   f"  [{t:6.1f}s] {s.phase:<10} attempt {s.attempt}  step {s.step:>4}/{self.scenario.steps}  {loss}  "
                   f"{s.tokens_per_s:8,.0f} tok/s  restarts {restarts}  {ck}"
               )

    def _note_placement(self, status: dict[str, Any]) -> None:
        attempt = note_placement(self.record, status)
        if attempt is not None:
            nodes, spares = self.record.placements[attempt], self.record.spares[attempt]
            moved = self.record.moved[attempt]
            self.echo(f"  placed attempt {attempt}: pods on {', '.join(nodes)}; spares {', '.join(spares) or 'none'}"
                      + (f"; moved pod indices {moved}" if moved else ""))

    def _note_restart(self, status: dict[str, Any]) -> None:
        note = note_restart(self.record, status)
        if note is not None:
            attempt = int((status.get("lastRestart") or {}).get("attempt", 0))
            self.echo(f"  restarted {describe_restart(attempt, note)}")

    def _note_pods(self, status: dict[str, Any], phase: str) -> None:
        pods = self.core.list_namespaced_pod(self.ns, label_selector=f"railyard.dev/job={self.name}").items
        seen = []
        gang: list[str] = []
        for p in pods:
            labels = p.metadata.labels or {}
            if (
                labels.get("railyard.dev/cleanup") == "true"
                or labels.get("railyard.dev/spare") == "true"
                or not p.spec.node_name
            ):
                continue
            if p.metadata.deletion_timestamp:
                continue
            try:
                attempt, index = (
                    int(labels.get("railyard.dev/attempt", -1)),
                    int(labels.get("railyard.dev/pod-index", -1)),
                )
            except ValueError:
                continue
            seen.append((attempt, index, str(p.spec.node_name)))
            if index >= 0:
                name = str(p.metadata.name)
                self.groups.pods[name] = PodSeen(name, str(p.metadata.uid), attempt, index, str(p.spec.node_name))
                gang.append(name)
        # the pods that serve the current attempt (kept ones were created for earlier attempts)
        members = members_of(status, seen)
        note_pods(self.record, members)
        serving = {(i, n) for _, i, n in members}
        gang = sorted(n for n in gang if (self.groups.pods[n].index, self.groups.pods[n].node) in serving)
        if phase == "Running" and gang:
            # the gang as it last ran (a finished job's pods may go before the last poll)
            self.groups.at_end = gang

    def _print_events(self) -> None:
        events = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={self.name}").items
        for ev in sorted(
            events, key=lambda e: (e.last_timestamp or e.event_time or e.metadata.creation_timestamp or 0).__str__()
        ):
            key = f"{ev.metadata.name}/{ev.count or 1}"
            if key in self.seen_events:
                continue
            self.seen_events.add(key)
            self.record.decisions.append(Decision(time.time(), ev.reason or "", ev.message or "", ev.type or "Normal"))
            if (
                self.scenario.bitflip
                and "bitflip" not in self.done_actions
                and "silent data corruption" in (ev.message or "").lower()
            ):
                # the flip and its detection are a step apart: status may never show the step
                self.done_actions.add("bitflip")
                self.record.actions.append((time.time(), f"bit flip (step {self.scenario.bitflip.step})"))
            self.echo(f"      operator: {ev.reason}: {ev.message}")

    def _act(self, s: Sample, status: dict[str, Any]) -> None:
        """Inject the scenario's cluster-level faults when training reaches their step."""
        # the node controls the local cluster's node agent watches (railyard local node slow/fail)
        from railyard_local.nodes import FAIL_ANNOTATION, SLOW_ANNOTATION

        scn = self.scenario
        # faults go to the nodes of the gang that runs now, not the previous attempt's
        current = int((status.get("placement") or {}).get("attempt", -1)) == s.attempt
        nodes = (self.record.placements.get(s.attempt) or []) if current else []
        if s.phase != "Running" or not nodes:
            return
        if scn.straggler and "straggler" not in self.done_actions and s.step >= scn.straggler.step:
            node = nodes[min(scn.straggler.pod_index, len(nodes) - 1)]
            self._annotate_node(node, {SLOW_ANNOTATION: f"{scn.straggler.factor:g}"})
            self.done_actions.add("straggler")
            self.record.actions.append((time.time(), f"slow {node}"))
            self.echo(f"  >>> fault: {node} now runs x{scn.straggler.factor:g} slower (a throttling GPU)")
        if (
            scn.node_failure
            and "node_failure" not in self.done_actions
            and s.attempt == 0
            and s.step >= scn.node_failure.step
        ):
            node = nodes[scn.node_failure.pod_index]
            self.groups.at_failure = list(self.groups.at_end)
            self._annotate_node(node, {FAIL_ANNOTATION: "true"})
            # the one time of the demo's own the replica-group report uses: when it injected the fault
            self.groups.injected_at, self.groups.lost_node = time.time(), node
            self.done_actions.add("node_failure")
            self.record.actions.append((self.groups.injected_at, f"fail {node}"))
            self.echo(f"  >>> fault: node {node} fails (NotReady, its processes and its RAM checkpoints are gone)")
        if (
            scn.bitflip
            and "bitflip" not in self.done_actions
            and s.attempt == scn.bitflip_attempt()
            and s.step >= scn.bitflip.step
        ):
            self.done_actions.add("bitflip")
            self.record.actions.append((time.time(), "bit flip"))
            self.echo(
                f"  >>> fault: the trainer flips a high-order bit in rank {scn.bitflip.rank}'s {scn.bitflip.target} "
                f"at step {scn.bitflip.step}"
            )

    def _annotate_node(self, node: str, annotations: dict[str, str]) -> None:
        self.core.patch_node(node, {"metadata": {"annotations": annotations}})

    # ------------------------------------------------------------------ results

    def _finish(self) -> Summary:
        restores = restores_from_status(self.status_history)
        summary = summarise(self.record, restores)
        if self.stragglers_seen:
            summary = Summary(**{**asdict(summary), "restores": restores, "stragglers": sorted(self.stragglers_seen)})
        if self.scenario.replica_groups is not None:
            self.group_report = build_group_report(
                self.job, self.groups, self.record.final_status, self.record.restarts
            )
        pictures = draw_all(self.record, self.out, self.group_report)
        self.echo("")
        self.echo("Summary")
        self.echo(format_summary(summary))
        if self.group_report is not None:
            self.echo(format_group_report(self.group_report, self.record.started_at))
        status_restarts = {k: v for k, v in summary.restarts.items() if k != "total" and v}
        metric_restarts = {k.lower(): v for k, v in self.metrics_restarts.items() if v}
        agree = {k.lower(): v for k, v in status_restarts.items()} == metric_restarts
        self.echo(
            f"  metrics         railyard_restarts_total {metric_restarts or '{}'} "
            f"{'agrees' if agree else 'DISAGREES'} with status.restarts"
        )
        if self.prometheus_report is not None:
            p = self.prometheus_report
            agrees = "agrees with the operator" if p["restartsAgree"] else "DISAGREES with the operator"
            self.echo(
                f"  prometheus      railyard_restarts_total {p['restarts'] or '{}'} {agrees}; alerts fired: "
                f"{', '.join(p['alertsFired']) or 'none'}"
            )
            self.echo(f"                  to look again: {p['reopen']}")
        self.echo("  pictures        " + ", ".join(str(p) for p in pictures))
        data = {
            "summary": {**asdict(summary), "restores": [asdict(r) for r in restores]},
            "metricsRestarts": self.metrics_restarts,
            "metricsAgree": agree,
            "prometheus": self.prometheus_report,
            "status": self.record.final_status,
            "decisions": [asdict(d) for d in self.record.decisions],
            "samples": [asdict(s) for s in self.record.samples],
            "placements": self.record.placements,
            "pods": self.record.pods,
            "placementPicture": placement_picture(self.record).pods(),
        }
        if self.group_report is not None:
            data["replicaGroups"] = {"report": asdict(self.group_report), "record": group_record_to_json(self.groups),
                                     "startedAt": self.record.started_at, "restarts": self.record.restarts}
        (self.out / "summary.json").write_text(json.dumps(data, indent=1, default=str))
        (self.out / "trainingjob.yaml").write_text(yaml.safe_dump(self.job, sort_keys=False))
        return summary
