"""Shared helpers for the operator-artifact tests (alerts, dashboard, systemd unit).

The external tools come from scripts/install-tools.sh, which unpacks Debian's
prometheus package into .tools/prometheus (promtool, prometheus); systemd-analyze
and systemd-sysusers come from the system. A missing tool skips the test locally
but fails it under CI (env CI set), where skipping would hide a broken check.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOLS_BIN = REPO / ".tools" / "prometheus" / "usr" / "bin"
RULES_FILE = REPO / "dashboards" / "kvwatch-alerts.yml"
RULES_TEST_FILE = REPO / "dashboards" / "tests" / "kvwatch-alerts.test.yml"
DASHBOARD_FILE = REPO / "dashboards" / "kvwatch.json"
UNIT_FILE = REPO / "systemd" / "kvwatch@.service"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def find_tool(name: str) -> str:
    """Path of `name`: .tools/prometheus/usr/bin first, then PATH.

    Not found: pytest.fail under CI, pytest.skip otherwise.
    """
    local = TOOLS_BIN / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found:
        return found
    msg = f"{name} not found in {TOOLS_BIN} or on PATH: run scripts/install-tools.sh"
    if in_ci():
        pytest.fail(msg + " (CI is set: missing tools fail, they do not skip)")
    pytest.skip(msg)
    raise AssertionError("unreachable")


_README_ROW = re.compile(r"^\|\s*`(kvwatch_[a-z0-9_]+)`\s*\|\s*([^|]+?)\s*\|\s*[^|]*\|\s*([^|]*?)\s*\|")


def _readme_rows() -> list[re.Match[str]]:
    rows = [m for line in (REPO / "docs" / "reference.md").read_text().splitlines() if (m := _README_ROW.match(line))]
    assert rows, "no metric table found in docs/reference.md"
    return rows


def readme_metrics() -> dict[str, str]:
    """Metric name -> type, from the metric table in docs/reference.md (the contract)."""
    return {m.group(1): m.group(2) for m in _readme_rows()}


def readme_metric_labels() -> dict[str, list[str]]:
    """Metric name -> its labels, from the same table."""
    return {m.group(1): re.findall(r"`(\w+)`", m.group(3)) for m in _readme_rows()}


def load_rules() -> dict:
    import yaml

    return yaml.safe_load(RULES_FILE.read_text())


def recording_rules() -> dict[str, str]:
    """Recorded series name -> expr, from the rules file."""
    return {r["record"]: r["expr"] for g in load_rules()["groups"] for r in g["rules"] if "record" in r}


def alert_rules() -> dict[str, dict]:
    return {r["alert"]: r for g in load_rules()["groups"] for r in g["rules"] if "alert" in r}


# --- PromQL: the metric names an expression selects ---------------------------------

_PROMQL_WORDS = {
    # aggregations and set/binary keywords; functions are told apart by the "(" after them
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "by", "without", "on", "ignoring", "group_left",
    "group_right", "and", "or", "unless", "offset", "bool", "atan2", "inf", "nan",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names selected in a PromQL expression (Grafana variables allowed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", " ", e)                                           # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                                          # range / subquery
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{[^}]*\}|\$\w+", " ", e)                                   # Grafana variables
    names: set[str] = set()
    for m in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", e):
        word = m.group(0)
        if e[m.end():].lstrip().startswith("("):
            continue  # a function or an aggregation
        if word.lower() in _PROMQL_WORDS:
            continue
        names.add(word)
    return names


def grafana_expr_to_promql(expr: str) -> str:
    """Replace Grafana's variables so promtool can parse the expression."""
    e = re.sub(r"\$__(?:rate_interval|interval|range)\b", "5m", expr)
    e = re.sub(r"\$\{[^}]*\}|\$\w+", ".*", e)
    return e
