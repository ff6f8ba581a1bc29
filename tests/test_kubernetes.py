"""deploy/kubernetes: every manifest valid offline against the Kubernetes schemas (kubernetes-validate)
and the Prometheus Operator's CRD models (cloudcoil's prometheus-operator models, whose unknown
fields would be dropped: a manifest must survive the round trip unchanged); the PrometheusRule is
dashboards/kvwatch-alerts.yml and passes promtool; the monitors select the pods and name their port.

No cluster here: what a cluster would add (admission, the operator's own reconciling) is not tested.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator.v1 import PodMonitor, PrometheusRule, ServiceMonitor
from operator_tools import find_tool

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "kubernetes"
K8S_VERSION = kubernetes_validate.latest_version()
CRD_MODELS = {"PodMonitor": PodMonitor, "ServiceMonitor": ServiceMonitor, "PrometheusRule": PrometheusRule}


def documents() -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path, doc))
    return out


def by_kind(kind: str, directory: str | None = None) -> list[dict]:
    return [d for p, d in documents() if d["kind"] == kind and (directory is None or p.parent.name == directory)]


def _clean(value: object) -> object:
    """JSON's view of a value (the models dump numbers and strings as JSON does)."""
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("path,doc", documents(), ids=lambda x: str(x.relative_to(DEPLOY)) if isinstance(x, Path) else "")
def test_manifest_is_valid(path: Path, doc: dict) -> None:
    model = CRD_MODELS.get(doc["kind"])
    if model is None:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)   # raises on an unknown field or type
        return
    dumped = model.model_validate(doc).model_dump(by_alias=True, exclude_unset=True, mode="json")
    assert dumped == _clean(doc), f"{path}: fields the {doc['kind']} CRD does not have, or of the wrong type"


def test_the_validators_do_refuse_mistakes() -> None:
    service = by_kind("Service")[0]
    broken = json.loads(json.dumps(service))
    broken["spec"]["ports"][0]["portt"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    monitor = json.loads(json.dumps(by_kind("PodMonitor")[0]))
    monitor["spec"]["podMetricsEndpoints"][0]["prot"] = "x"
    assert PodMonitor.model_validate(monitor).model_dump(by_alias=True, exclude_unset=True, mode="json") != monitor


def test_kustomizations_name_files_that_exist() -> None:
    for kustomization in DEPLOY.rglob("kustomization.yaml"):
        data = yaml.safe_load(kustomization.read_text())
        for resource in data.get("resources", []):
            target = (kustomization.parent / resource).resolve()
            assert target.exists(), f"{kustomization}: {resource}"
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), f"{kustomization}: {resource} has no kustomization"


def test_prometheusrule_is_the_alerts_file_and_current() -> None:
    out = subprocess.run([sys.executable, str(DEPLOY / "monitoring" / "generate.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [rule] = by_kind("PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load((REPO / "dashboards" / "kvwatch-alerts.yml").read_text())["groups"]
    [dashboard] = by_kind("ConfigMap", "monitoring")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["kvwatch.json"]) == json.loads((REPO / "dashboards" / "kvwatch.json").read_text())


def test_prometheusrule_groups_pass_promtool(tmp_path: Path) -> None:
    [rule] = by_kind("PrometheusRule")
    rules = tmp_path / "kvwatch-alerts.yml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    promtool = find_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    # the repository's promtool unit tests, run against the PrometheusRule's groups
    tests = yaml.safe_load((REPO / "dashboards" / "tests" / "kvwatch-alerts.test.yml").read_text())
    tests["rule_files"] = [str(rules)]
    test_file = tmp_path / "kvwatch-alerts.test.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    unit = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120)
    assert unit.returncode == 0, unit.stdout + unit.stderr


@pytest.mark.parametrize("variant", ["kvwatch-run", "export-sidecar"])
def test_monitors_select_the_pods_and_their_port(variant: str) -> None:
    [deployment] = by_kind("Deployment", variant)
    pod = deployment["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    [podmonitor] = by_kind("PodMonitor")
    assert podmonitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert all(e["port"] in ports for e in podmonitor["spec"]["podMetricsEndpoints"])
    [service] = by_kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert all(p["targetPort"] in ports for p in service["spec"]["ports"])
    [servicemonitor] = by_kind("ServiceMonitor")
    assert servicemonitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in servicemonitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}


def test_the_kvwatch_pod_probes_and_grace_period_fit_kvwatch() -> None:
    import tomllib

    from kvwatch.watchdog.config import config_from_mapping, with_overrides

    [deployment] = by_kind("Deployment", "kvwatch-run")
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    args = container["args"]
    assert args[:3] == ["--config", "/etc/kvwatch/kvwatch.toml", "--"]
    [configmap] = by_kind("ConfigMap", "kvwatch-run")
    data = tomllib.loads(configmap["data"]["kvwatch.toml"])
    # kvwatch's own parser accepts the ConfigMap's file with the pod's engine command
    config = with_overrides(config_from_mapping(data, "kvwatch.toml"), command=args[3:])
    assert spec["terminationGracePeriodSeconds"] > config.engine.stop_timeout_seconds
    assert config.listen == "0.0.0.0:9400"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert config.state_dir in mounts and "/etc/kvwatch" in mounts
