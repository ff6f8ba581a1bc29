"""The Grafana dashboard: provisioning-ready JSON whose every query reads only the
documented metrics (docs/reference.md) and the recording rules of dashboards/kvwatch-alerts.yml."""
from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from operator_tools import (
    DASHBOARD_FILE,
    REPO,
    RULES_FILE,
    find_tool,
    grafana_expr_to_promql,
    promql_metric_names,
    readme_metric_labels,
    readme_metrics,
    recording_rules,
)

DS_REF = {"type": "prometheus", "uid": "${datasource}"}


def _dashboard() -> dict:
    return json.loads(DASHBOARD_FILE.read_text())


def _panels(panels: list[dict]) -> Iterator[dict]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _queries(dash: dict) -> Iterator[tuple[str, str]]:
    """(where, expr) for every panel target, annotation and variable query."""
    for p in _panels(dash["panels"]):
        for t in p.get("targets", []):
            yield f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"]
    for a in dash["annotations"]["list"]:
        if "expr" in a:
            yield f"annotation {a['name']!r}", a["expr"]


def _variables(dash: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def _var_query(var: dict) -> str:
    q = var["query"]
    return q["query"] if isinstance(q, dict) else q


def test_json_is_provisioning_ready() -> None:
    text = DASHBOARD_FILE.read_text()
    dash = json.loads(text)
    assert "${DS_" not in text, "use the datasource variable, not import-time ${DS_...} inputs"
    assert "__inputs" not in dash and "__requires" not in dash
    assert dash["uid"] == "kvwatch" and dash["title"]
    assert "id" not in dash or dash["id"] is None, "a provisioned dashboard carries no database id"


def test_datasource_variable() -> None:
    var = _variables(_dashboard()).get("datasource")
    assert var is not None, "no datasource variable"
    assert var["type"] == "datasource" and var["query"] == "prometheus"


@pytest.mark.parametrize(
    ("name", "metric"),
    [("instance", "kvwatch_build_info"), ("engine", "kvwatch_engine_up"), ("gpu", "kvwatch_gpu_info")],
)
def test_query_variables(name: str, metric: str) -> None:
    var = _variables(_dashboard()).get(name)
    assert var is not None, f"no {name} variable"
    assert var["type"] == "query" and var["datasource"] == DS_REF
    q = _var_query(var)
    assert q.startswith("label_values(") and metric in q and q.rstrip(")").endswith(name), q


def test_every_panel_and_target_uses_the_datasource_variable() -> None:
    dash = _dashboard()
    for p in _panels(dash["panels"]):
        if p["type"] == "row":
            continue
        assert p.get("datasource") == DS_REF, f"panel {p['id']} {p['title']!r}: {p.get('datasource')}"
        assert p.get("targets"), f"panel {p['id']} {p['title']!r} has no query"
        for t in p["targets"]:
            assert t.get("datasource") == DS_REF, f"panel {p['id']} target {t['refId']}"
    for a in dash["annotations"]["list"]:
        if "expr" in a:
            assert a["datasource"] == DS_REF, a["name"]


def test_panels_are_laid_out_with_unique_ids() -> None:
    ids = [p["id"] for p in _panels(_dashboard()["panels"])]
    assert len(ids) == len(set(ids)), ids
    for p in _panels(_dashboard()["panels"]):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, (p["title"], g)


def test_repeated_panels_name_an_existing_variable() -> None:
    dash = _dashboard()
    variables = _variables(dash)
    for p in _panels(dash["panels"]):
        if "repeat" in p:
            assert p["repeat"] in variables and variables[p["repeat"]]["multi"], p["title"]


def test_every_query_reads_contract_metrics_or_recording_rules() -> None:
    known = set(readme_metrics()) | set(recording_rules())
    seen = 0
    for where, expr in _queries(_dashboard()):
        names = promql_metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= known, f"{where}: not in docs/reference.md nor a recording rule: {sorted(names - known)}"
        seen += 1
    assert seen >= 15


def test_dashboard_shows_every_contract_metric() -> None:
    """Each documented metric appears on the dashboard, directly or through a recording rule."""
    rules = recording_rules()
    shown: set[str] = set()
    for _, expr in _queries(_dashboard()):
        for name in promql_metric_names(expr):
            shown.add(name)
            if name in rules:
                shown |= promql_metric_names(rules[name])
    missing = set(readme_metrics()) - shown
    assert not missing, f"documented metrics (docs/reference.md) not on the dashboard: {sorted(missing)}"


@pytest.mark.promtool
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (Grafana variables replaced) as a recording rule."""
    rules = [{"record": f"dashboard:query_{i}", "expr": grafana_expr_to_promql(expr)}
             for i, (_, expr) in enumerate(_queries(_dashboard()))]
    for name, var in _variables(_dashboard()).items():
        if var["type"] == "query":  # label_values(selector, label): the selector must parse
            q = _var_query(var)
            rules.append({"record": f"dashboard:var_{name}",
                          "expr": grafana_expr_to_promql(q[len("label_values("):q.rindex(",")])})
    f = tmp_path / "dashboard-queries.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = subprocess.run([find_tool("promtool"), "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


# One value per label for the synthetic kvwatch page below; `state` is handled apart.
_LABEL_VALUES = {
    "engine": "kimi", "gpu": "GPU-8d3c0f5e", "reason": "engine_died", "kind": "kernel_smem",
    "cause": "block_alignment", "collector": "nvml", "version": "0.1.0", "index": "0",
    "name": "NVIDIA H200", "block_size": "64", "kv_cache_dtype": "fp8", "backend": "FLASHMLA",
    "attention": "mla", "rank": "0", "source": "exact", "part": "weights", "planned_as": "0.33.0",
    "change": "--kv-cache-dtype fp8", "plan": "recommended", "result": "kept", "outcome": "released",
}
_TARGET = 'job="kvwatch",instance="gpu1:9400"'


def _synthetic_series() -> list[dict[str, str]]:
    """Every documented metric with its documented labels, as kvwatch would export them for
    one engine on one GPU over 30 minutes (counters rising, the engine READY)."""
    series = [{"series": f"up{{{_TARGET}}}", "values": "1x30"}]
    for metric, labels in readme_metric_labels().items():
        if "state" in labels:
            for state in ("starting", "ready", "backoff", "stopping", "stopped", "fatal"):
                series.append({"series": f'{metric}{{{_TARGET},engine="kimi",state="{state}"}}',
                               "values": "1x30" if state == "ready" else "0x30"})
            continue
        sel = ",".join([_TARGET] + [f'{l}="{_LABEL_VALUES[l]}"' for l in labels])
        if metric.endswith("_total"):
            values = "0+1x30"
        elif metric.endswith("_ratio"):
            values = "0.5x30"
        elif metric == "kvwatch_gpu_memory_total_bytes":
            values = "150000000000x30"
        else:
            values = "1x30"
        series.append({"series": f"{metric}{{{sel}}}", "values": values})
    return series


@pytest.mark.promtool
def test_every_query_returns_data_for_the_readme_metrics(tmp_path: Path) -> None:
    """Given the documented metrics (docs/reference.md) (with their documented labels), every dashboard query, with
    all variables at All, returns at least one series, recording rules included.

    Each query becomes an alert `count(<query>) > 0`; promtool's unit test expects each
    to fire. A stand-in for the end-to-end test against a real kvwatch."""
    queries = [(where, grafana_expr_to_promql(expr)) for where, expr in _queries(_dashboard())]
    rules = [{"alert": f"DashboardQuery{i}", "expr": f"count({expr}) > 0"} for i, (_, expr) in enumerate(queries)]
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    test = {
        "rule_files": [str(RULES_FILE), "queries.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": _synthetic_series(),
            "alert_rule_test": [{"eval_time": "30m", "alertname": r["alert"], "exp_alerts": [{"exp_labels": {}}]}
                                for r in rules],
        }],
    }
    (tmp_path / "queries.test.yml").write_text(yaml.safe_dump(test))
    res = subprocess.run([find_tool("promtool"), "test", "rules", "queries.test.yml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    empty = sorted({queries[int(n)][0] for n in re.findall(r"alertname: DashboardQuery(\d+)", out)})
    assert res.returncode == 0, "queries without data:\n" + "\n".join(empty) + "\n" + out[-3000:]


def test_grafana_provisioning_files() -> None:
    prov = yaml.safe_load((REPO / "dashboards" / "provisioning" / "kvwatch.yml").read_text())
    assert prov["apiVersion"] == 1
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    ds = yaml.safe_load((REPO / "dashboards" / "provisioning" / "datasource.example.yml").read_text())
    assert ds["apiVersion"] == 1
    assert [d["type"] for d in ds["datasources"]] == ["prometheus"]
