"""A real Prometheus beside the local cluster (``railyard demo --prometheus`` and the tests).

The ``prometheus`` binary (Debian's package or upstream's) runs as a child process on loopback
only, with its own data folder, scraping the operator the way the chart's ServiceMonitor does:
``honor_labels: true``, so per-job series keep the TrainingJob's name in ``job``. Railyard's
alerting rules (deploy/prometheus/railyard-alerts.yaml) are loaded when the file is there.
Everything here speaks Prometheus's HTTP API (``/api/v1``) and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from railyard.protocol.ports import free_port as _free_port

#: The scrape job's name: what ``job`` holds on the operator's own series (honor_labels keeps
#: the TrainingJob's name on per-job series).
SCRAPE_JOB = "railyard"
#: The plain rule file (the same rules as the chart's PrometheusRule), when running from a checkout.
RULES_FILE = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "railyard-alerts.yaml"


class PrometheusError(RuntimeError):
    """Prometheus could not start, or its API answered with an error (the message is its own)."""


def find_prometheus() -> str | None:
    """The ``prometheus`` binary on PATH, or None."""
    return shutil.which("prometheus")


def build_config(
    targets: Sequence[str], *, scrape_interval_s: float, rule_files: Sequence[Path] = ()
) -> dict[str, Any]:
    """prometheus.yml: one scrape job over ``targets`` (host:port of operators' /metrics)."""
    interval = _duration(scrape_interval_s)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": SCRAPE_JOB,
                "honor_labels": True,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }


def _duration(seconds: float) -> str:
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: Prometheus goes when its parent goes, however the parent ends."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@dataclass
class Prometheus:
    """A running Prometheus: its URL, files and a small client of its HTTP API."""

    proc: subprocess.Popen[bytes]
    url: str
    config_file: Path
    data_dir: Path
    log_file: Path

    # -------------------------------------------------------------------- HTTP API

    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a success, :class:`PrometheusError` (with
        Prometheus's own message) otherwise. List values become repeated parameters."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {exc.code}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
        return body.get("data")

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (``[{"metric": {...}, "value": [t, "v"]}]``)."""
        data = self.api("query", query=expr, time=at)
        return (
            list(data["result"])
            if data["resultType"] in ("vector", "matrix")
            else [{"metric": {}, "value": data["result"]}]
        )

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's matrix (``[{"metric": {...}, "values": [[t, "v"], ...]}]``)."""
        return list(self.api("query_range", query=expr, start=start, end=end, step=step)["result"])

    def series(self, match: str, start: float | None = None, end: float | None = None) -> list[dict[str, str]]:
        """The label sets of every series matching ``match`` between ``start`` and ``end``."""
        return list(self.api("series", **{"match[]": [match]}, start=start, end=end))

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_until(self, what: str, pred: Any, timeout: float, interval: float = 0.25) -> Any:
        """Poll ``pred()`` until truthy (API errors count as not yet); PrometheusError on timeout."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            self._check_alive()
            try:
                last = pred()
            except PrometheusError as exc:
                last = exc
            else:
                if last:
                    return last
            if time.monotonic() > deadline:
                raise PrometheusError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}"[:2000])
            time.sleep(interval)

    def wait_for_targets(self, timeout: float = 60.0) -> None:
        """Until every target has been scraped successfully once (``up == 1``)."""
        expected = len(
            yaml.safe_load(self.config_file.read_text())["scrape_configs"][0]["static_configs"][0]["targets"]
        )
        self.wait_until(
            f"{expected} target(s) scraped",
            lambda: len([r for r in self.query(f'up{{job="{SCRAPE_JOB}"}} == 1')]) >= expected,
            timeout,
        )

    # -------------------------------------------------------------------- process

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise PrometheusError(f"prometheus exited with {self.proc.returncode}: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_prometheus(
    workdir: Path,
    targets: Sequence[str],
    *,
    scrape_interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
    port: int = 0,
    binary: str | None = None,
    timeout: float = 60.0,
) -> Prometheus:
    """Start Prometheus on 127.0.0.1 (``port`` 0: a free one) with its files under ``workdir``
    and wait, at most ``timeout`` seconds, until it is ready to serve queries."""
    exe = binary or find_prometheus()
    if exe is None:
        raise PrometheusError("no prometheus binary on PATH (Debian: apt-get install prometheus)")
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(
        yaml.safe_dump(
            build_config(targets, scrape_interval_s=scrape_interval_s, rule_files=rule_files), sort_keys=False
        )
    )
    data_dir = workdir / "data"
    log_file = workdir / "prometheus.log"
    last_error = ""
    for _ in range(3):  # a free port can be taken between choosing it and Prometheus binding it
        listen = port or _free_port()
        argv = [
            exe,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{listen}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ]
        with log_file.open("ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=_die_with_parent, env=dict(os.environ))
        prom = Prometheus(proc, f"http://127.0.0.1:{listen}", config_file, data_dir, log_file)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and not prom.ready():
            if time.monotonic() > deadline:
                prom.stop()
                raise PrometheusError(f"prometheus was not ready within {timeout:.0f} s: {prom.log_tail()}")
            time.sleep(0.1)
        if proc.poll() is None:
            return prom
        last_error = prom.log_tail()
        if port or "address already in use" not in last_error:
            break
    raise PrometheusError(f"prometheus did not start: {last_error}")


# ------------------------------------------------------------------------ what the demo shows

#: Queries worth trying while the demo runs (printed with links into Prometheus's UI).
EXAMPLE_QUERIES = (
    "sum by (class) (railyard_restarts_total)",
    'railyard_step_time_seconds{percentile="50"}',
    "railyard_job_goodput_ratio",
    "ALERTS",
)


def graph_url(base: str, expr: str, range_s: int = 900) -> str:
    """A link to Prometheus's graph page showing ``expr`` over the last ``range_s`` seconds."""
    return f"{base}/graph?" + urllib.parse.urlencode({"g0.expr": expr, "g0.tab": "0", "g0.range_input": f"{range_s}s"})


@dataclass(frozen=True)
class PrometheusReport:
    """What Prometheus saw of a run: restarts by class (lower case, non-zero) and the alerts
    that fired (``AlertName namespace/job``, or the bare name for operator-wide alerts)."""

    restarts: dict[str, int]
    alerts_fired: list[str]


def build_report(prom: Prometheus, start: float, end: float) -> PrometheusReport:
    restarts = {
        r["metric"].get("class", "").lower(): int(float(r["value"][1]))
        for r in prom.query("sum by (class) (railyard_restarts_total)", at=end)
        if float(r["value"][1])
    }
    fired = set()
    for s in prom.query_range('ALERTS{alertstate="firing"}', start, end, max(1.0, (end - start) / 1000)):
        m = s["metric"]
        where = f" {m['namespace']}/{m['job']}" if "namespace" in m and m.get("job") != SCRAPE_JOB else ""
        fired.add(f"{m['alertname']}{where}")
    return PrometheusReport(restarts, sorted(fired))
