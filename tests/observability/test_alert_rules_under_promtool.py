"""The alerting rules as Prometheus itself reads them: ``promtool check rules`` on every shape we
ship (plain file, PrometheusRule, the chart's rendering), ``promtool test rules`` unit tests that
fire each alert and keep it quiet, and proof that a broken or renamed expression fails."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.deployment.chart import PRODUCTION_VALUES, load_values

from .rules import (
    PLAIN_RULES,
    UNIT_TESTS,
    alerts,
    chart_groups,
    plain_groups,
    prometheusrule_groups,
    run_promtool,
    seconds,
    write_rules,
)


def test_the_three_shapes_of_the_rules_are_the_same_rules() -> None:
    assert plain_groups() == prometheusrule_groups(), "railyard-alerts.yaml and railyard-rules.yaml differ"
    assert plain_groups() == chart_groups(), "the chart's default rules differ from deploy/prometheus"


@pytest.mark.parametrize("shape", ["plain", "prometheusrule", "chart-defaults", "chart-production", "chart-custom"])
def test_promtool_accepts_the_rules(promtool: str, tmp_path: Path, shape: str) -> None:
    groups = {
        "plain": plain_groups,
        "prometheusrule": prometheusrule_groups,
        "chart-defaults": chart_groups,
        "chart-production": lambda: chart_groups(load_values(PRODUCTION_VALUES)),
        "chart-custom": lambda: chart_groups({"prometheusRule": {"restartsPerHour": 10, "heartbeatStaleSeconds": 300, "unplaceableMinutes": 90}}),
    }[shape]()
    out = run_promtool(promtool, "check", "rules", write_rules(groups, tmp_path / "rules.yaml"))
    assert out.returncode == 0, f"{promtool} check rules:\n{out.stdout}{out.stderr}"
    assert f"SUCCESS: {len(alerts(groups))} rules found" in out.stdout


def test_the_alert_unit_tests_pass(promtool: str) -> None:
    assert UNIT_TESTS, "no promtool unit tests under deploy/prometheus/tests"
    out = run_promtool(promtool, "test", "rules", *UNIT_TESTS)
    assert out.returncode == 0, f"{promtool} test rules:\n{out.stdout}{out.stderr}"


def _unit_tests_against(promtool: str, groups: list[dict[str, Any]], folder: Path) -> Any:
    """Run the checked-in unit tests over ``groups`` (written where the tests look for rules)."""
    write_rules(groups, folder / PLAIN_RULES.name)
    (folder / "tests").mkdir()
    for f in UNIT_TESTS:
        shutil.copy(f, folder / "tests" / f.name)
    return run_promtool(promtool, "test", "rules", *sorted((folder / "tests").glob("*.yaml")))


def test_the_alert_unit_tests_pass_against_the_rules_the_chart_renders(promtool: str, tmp_path: Path) -> None:
    out = _unit_tests_against(promtool, chart_groups(), tmp_path)
    assert out.returncode == 0, f"the chart's rules fail the unit tests:\n{out.stdout}{out.stderr}"


# --- coverage of the unit tests (plain YAML: no promtool needed) -----------------------------


def _cases() -> dict[str, list[tuple[str, float, list[dict[str, Any]]]]]:
    """alertname -> (test group, eval time in s, expected alerts) of every alert_rule_test."""
    out: dict[str, list[tuple[str, float, list[dict[str, Any]]]]] = {}
    for f in UNIT_TESTS:
        doc = yaml.safe_load(f.read_text())
        assert doc.get("rule_files") == [f"../{PLAIN_RULES.name}"], f"{f.name} must test {PLAIN_RULES.name}"
        for i, group in enumerate(doc["tests"]):
            name = f"{f.name}: {group.get('name', i)}"
            for case in group.get("alert_rule_test") or []:
                out.setdefault(case["alertname"], []).append((name, seconds(case["eval_time"]), case.get("exp_alerts") or []))
    return out


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = _cases()
    rules = alerts(plain_groups())
    unknown = sorted(set(cases) - set(rules))
    assert not unknown, f"unit tests for alerts the rules do not have: {unknown}"
    for name, rule in rules.items():
        mine = cases.get(name, [])
        hold = seconds(rule.get("for"))
        firing = [(g, t, exp) for g, t, exp in mine if exp]
        assert firing, f"{name}: no unit test in which it fires"
        for group, t, exp in firing:
            assert t >= hold, f"{name} ({group}): expected to fire at {t:g}s, before its for: {rule.get('for')}"
            for alert in exp:
                assert set(rule.get("annotations", {})) <= set(alert.get("exp_annotations", {})), (
                    f"{name} ({group}): a firing case must check every annotation (their templates render)"
                )
            if hold:
                # quiet at some point less than `for` before it fires: the condition already
                # held then (it held for `for` up to the firing time), so `for` is what delayed it
                pending = [tq for gq, tq, expq in mine if gq == group and not expq and t - hold < tq < t]
                assert pending, f"{name} ({group}): no quiet evaluation within its for: ({rule['for']}) before it fires"
        groups_with_firing = {g for g, _, _ in firing}
        quiet = {g for g, _, _ in mine} - groups_with_firing
        assert quiet, f"{name}: no unit test group in which it stays quiet on healthy series"


# --- what a mistake looks like -----------------------------------------------------------------


def _mutated(old: str, new: str) -> list[dict[str, Any]]:
    text = PLAIN_RULES.read_text()
    assert old in text, old
    return list(yaml.safe_load(text.replace(old, new, 1))["groups"])


@pytest.mark.parametrize(("old", "new", "message"), [
    ("(increase(railyard_restarts_total[1h])) > 3", "(increase(railyard_restarts_total[1h]) > 3", "unclosed left parenthesis"),
    ("increase(railyard_sdc_detected_total[15m])", "increse(railyard_sdc_detected_total[15m])", "unknown function"),
    ("rate(railyard_reconcile_errors_total[10m])", "rate(railyard_reconcile_errors_total)", "expected type range vector"),
    ("{{ $labels.class }}", "{{ $labels.class }", "template"),
])
def test_promtool_rejects_a_broken_rule(promtool: str, tmp_path: Path, old: str, new: str, message: str) -> None:
    out = run_promtool(promtool, "check", "rules", write_rules(_mutated(old, new), tmp_path / "rules.yaml"))
    assert out.returncode != 0, f"{promtool} accepted a broken rule ({new})"
    assert message in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("metric", ["railyard_restarts_total", "railyard_heartbeat_age_seconds"])
def test_a_renamed_metric_fails_the_alert_unit_tests(promtool: str, tmp_path: Path, metric: str) -> None:
    """Valid PromQL over a metric nobody exports: check rules passes, the unit tests do not."""
    groups = _mutated(metric, metric.replace("railyard_", "railyard_old_"))
    assert run_promtool(promtool, "check", "rules", write_rules(groups, tmp_path / "check.yaml")).returncode == 0
    out = _unit_tests_against(promtool, groups, tmp_path)
    assert out.returncode != 0, f"the unit tests passed over rules that query {metric.replace('railyard_', 'railyard_old_')}"
    assert "FAILED" in out.stdout + out.stderr
