"""A shortened `railyard demo` end to end on the local cluster: the real operator and trainer
through a straggler, a node failure and a bit flip, and a summary that agrees with the status
and the operator's metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from railyard.demo.runner import Demo
from railyard.demo.scenario import BitFlip, NodeFailure, Scenario, Straggler

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.torch]


def test_short_demo_survives_its_faults_and_reports_consistently(tmp_path: Path) -> None:
    scenario = Scenario(steps=30, node_failure=NodeFailure(step=12), straggler=Straggler(step=3, factor=1.6), bitflip=BitFlip(step=22))
    lines: list[str] = []
    demo = Demo(scenario, tmp_path / "out", echo=lines.append, timeout=420)
    summary = demo.run()
    log = "\n".join(lines)
    assert summary.phase == "Succeeded", log
    assert summary.steps == 30
    # the node failure and the bit flip each restarted the gang, each in its own class
    assert summary.restarts.get("infrastructure", 0) >= 1 and summary.restarts.get("sdc", 0) == 1, log
    # restores came from a verified checkpoint; the SDC restore is from before the flip
    assert summary.restores and all(r.tier in ("memory", "local", "shared") for r in summary.restores), log
    sdc_restore = summary.restores[-1]
    assert sdc_restore.step < 22, log
    assert summary.quarantined, log
    data = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert data["metricsAgree"], log
    assert data["status"]["restarts"]["total"] == sum(v for k, v in summary.restarts.items() if k != "total")
    # the placement picture shows the final attempt's pods where they really ran
    from railyard.demo.record import placement_picture

    final = max(demo.record.pods)
    assert final == data["status"]["attempt"], log
    assert placement_picture(demo.record).pods() == demo.record.pods[final], log
    for picture in ("loss.png", "timeline.png", "placement.png"):
        assert (tmp_path / "out" / picture).stat().st_size > 5000
