"""docs/metrics.md is generated from the code and matches what a running operator serves."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tests.waiting import wait_until

from railyard.observe import metrics_doc
from railyard.protocol.ports import free_port as _free_port

from . import rawkube
from .chart import ROOT

STRUCTURAL_LABELS = {"histogram": {"le"}, "summary": {"quantile"}}


def test_docs_metrics_md_is_current() -> None:
    assert (ROOT / "docs" / "metrics.md").read_text() == metrics_doc.render_markdown(metrics_doc.collect_metrics()), (
        "docs/metrics.md is stale: run `python -m railyard.observe.metrics_doc`"
    )


def test_every_documented_metric_says_what_it_means() -> None:
    docs = metrics_doc.collect_metrics()
    assert len(docs) >= 10
    for d in docs:
        assert d.name.startswith("railyard_") and d.help.strip(), d
        assert not d.name.endswith("_total"), f"{d.name}: prometheus-client appends _total itself"


def _integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@pytest.fixture(scope="module")
def operator_metrics_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`railyard operator run` (a real process) against our embedded API server; its /metrics URL."""
    from kubernetes import config as k8s_config

    from railyard_local.apiserver.process import start_server_process

    work = tmp_path_factory.mktemp("operator-metrics")
    srv = start_server_process(work / "api")
    proc: subprocess.Popen[bytes] | None = None
    try:
        kubeconfig = srv.write_kubeconfig(work / "kubeconfig")
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        crd = yaml.safe_load((ROOT / "crds" / "trainingjob.yaml").read_text())
        # as kubectl and Helm send YAML (Go's YAML -> JSON turns 0.0 into 0)
        status, body = rawkube.request(api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                       _integral_floats_as_ints(crd))
        assert status == 201, body
        api.close()
        port = _free_port()
        log = (work / "operator.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "railyard", "operator", "run", "--kubeconfig", str(kubeconfig),
             "--standalone", "--all-namespaces", "--metrics-host", "127.0.0.1", "--metrics-port", str(port)],
            stdout=log, stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}/metrics"
        started = proc

        def served() -> bool:
            assert started.poll() is None, f"operator exited with {started.returncode}: {Path(log.name).read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return bool(resp.status == 200)
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(served, timeout=60, interval=0.2, message="the operator to serve /metrics",
                   explain=lambda: Path(log.name).read_text()[-2000:])
        yield url
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        srv.stop()


@pytest.mark.cluster
def test_running_operator_serves_the_documented_metrics(operator_metrics_url: str) -> None:
    with urllib.request.urlopen(operator_metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    documented = {d.name: d for d in metrics_doc.collect_metrics()}
    served = {
        f.name: f for f in text_string_to_metric_families(text)
        if f.name.startswith("railyard_")
        # prometheus-client's creation timestamps of counters and histograms, not metrics of ours
        and not (f.name.endswith("_created") and f.name.removesuffix("_created") in documented)
    }
    assert served, "the operator serves no railyard_ metric"
    undocumented = sorted(set(served) - set(documented))
    assert undocumented == [], f"served but not in docs/metrics.md: {undocumented}"
    for name, family in served.items():
        doc = documented[name]
        assert family.type == doc.type, f"{name}: served as {family.type}, documented as {doc.type}"
        for sample in family.samples:
            labels = set(sample.labels) - STRUCTURAL_LABELS.get(doc.type, set())
            assert labels == set(doc.labels), f"{sample.name}: labels {sorted(labels)}, documented {list(doc.labels)}"
    not_served = sorted(set(documented) - set(served))
    if not_served:
        sources = sorted({documented[n].source for n in not_served})
        pytest.xfail(f"defined but not registered in the running operator ({', '.join(sources)}): {', '.join(not_served)}")
