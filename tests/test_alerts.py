"""The Prometheus rules file: valid for promtool, unit-tested by promtool, and every
alert both firing and not firing in those unit tests."""
from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from operator_tools import (
    REPO,
    RULES_FILE,
    RULES_TEST_FILE,
    alert_rules,
    find_tool,
    promql_metric_names,
    readme_metrics,
    recording_rules,
)

RUNBOOK_BASE = "https://github.com/kvwatch/kvwatch/blob/main/docs/operations.md#"
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w|y)$")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_tool("promtool"), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.promtool
def test_promtool_check_rules() -> None:
    res = _promtool("check", "rules", str(RULES_FILE))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout, res.stdout + res.stderr


@pytest.mark.promtool
def test_promtool_unit_tests() -> None:
    res = _promtool("test", "rules", str(RULES_TEST_FILE))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    doc = yaml.safe_load(RULES_TEST_FILE.read_text())
    assert doc["rule_files"] == ["../kvwatch-alerts.yml"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            name = check["alertname"]
            if check.get("exp_alerts"):
                fired.add(name)
                for alert in check["exp_alerts"]:
                    # Firing cases check the full label set and every annotation.
                    assert "severity" in alert["exp_labels"], (name, alert)
                    assert set(alert["exp_annotations"]) >= {"summary", "description", "runbook_url"}, name
            else:
                quiet.add(name)
    alerts = set(alert_rules())
    assert alerts - fired == set(), f"alerts never tested firing: {sorted(alerts - fired)}"
    assert alerts - quiet == set(), f"alerts never tested not firing: {sorted(alerts - quiet)}"
    assert (fired | quiet) - alerts == set(), f"tests name unknown alerts: {sorted((fired | quiet) - alerts)}"


def test_every_recording_rule_is_unit_tested() -> None:
    doc = yaml.safe_load(RULES_TEST_FILE.read_text())
    tested = set()
    for case in doc["tests"]:
        for check in case.get("promql_expr_test", []):
            tested |= promql_metric_names(check["expr"])
    # A recording rule is covered by a direct expression test or through an alert on it.
    via_alerts = set().union(*(promql_metric_names(a["expr"]) for a in alert_rules().values()))
    missing = set(recording_rules()) - tested - via_alerts
    assert not missing, f"recording rules with no test: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(alert_rules()))
def test_alert_conventions(name: str) -> None:
    rule = alert_rules()[name]
    assert name.startswith("Kvwatch"), name
    m = _DURATION.match(str(rule.get("for", "")))
    assert m and int(m.group(1)) > 0, f"{name}: needs a non-zero for:"
    assert rule["labels"]["severity"] in {"critical", "warning"}, name
    ann = rule["annotations"]
    assert {"summary", "description", "runbook_url"} <= set(ann), name
    assert "{{" in ann["description"], f"{name}: the description should carry values or labels"
    assert ann["runbook_url"] == RUNBOOK_BASE + name.lower(), name


def test_runbook_has_a_section_per_alert() -> None:
    ops = (REPO / "docs" / "operations.md").read_text()
    assert re.search(r"^## Runbook\s*$", ops, re.M), "docs/operations.md needs a '## Runbook' section"
    runbook = ops.split("## Runbook", 1)[1]
    headings = set(re.findall(r"^### (\w+)\s*$", runbook, re.M))
    assert set(alert_rules()) <= headings, f"runbook sections missing: {sorted(set(alert_rules()) - headings)}"


def test_rules_only_use_contract_metrics() -> None:
    """Every series a rule reads is a documented metric, a recording rule, or Prometheus' up."""
    known = set(readme_metrics()) | set(recording_rules()) | {"up"}
    rules = [r for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]]
    for rule in rules:
        unknown = promql_metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: unknown metrics {sorted(unknown)}"


def test_recording_rule_names_follow_convention() -> None:
    for name in recording_rules():
        assert re.fullmatch(r"kvwatch:[a-z0-9_]+(:[a-z0-9_]+)?", name), name
