"""``railyard demo --prometheus`` without a Prometheus says what to install, before starting anything."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

from railyard.demo.prometheus import EXAMPLE_QUERIES, build_config, graph_url


def test_demo_prometheus_without_the_binary_says_what_to_install(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path))  # no prometheus (nor anything else) on PATH
    out = subprocess.run([sys.executable, "-m", "railyard", "demo", "--prometheus", "--out", str(tmp_path / "demo")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "apt-get install" in out.stderr and "--prometheus" in out.stderr, out.stderr
    assert not (tmp_path / "demo").exists(), "nothing may start before the check"


def test_the_scrape_config_keeps_the_trainingjob_in_job_and_stays_on_loopback() -> None:
    cfg = build_config(["127.0.0.1:8080"], scrape_interval_s=0.5)
    job = cfg["scrape_configs"][0]
    assert job["honor_labels"] is True, "as the chart's ServiceMonitor: per-job series keep job=<TrainingJob>"
    assert cfg["global"]["scrape_interval"] == "500ms" and job["static_configs"] == [{"targets": ["127.0.0.1:8080"]}]


def test_the_printed_links_carry_the_example_queries() -> None:
    for expr in EXAMPLE_QUERIES:
        url = graph_url("http://127.0.0.1:9090", expr)
        assert urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["g0.expr"] == [expr]
