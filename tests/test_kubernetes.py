"""deploy/kubernetes: every manifest valid offline against the Kubernetes schemas (kubernetes-validate)
and the Prometheus Operator's CRD models (cloudcoil's prometheus-operator models, whose unknown
fields would be dropped: a manifest must survive the round trip unchanged); the PrometheusRule is
dashboards/kvwatch-alerts.yml and passes promtool; the monitors select the pods and name their port.

No cluster here: what a cluster would add (admission, the operator's own reconciling) is not tested.
"""
from __future__ import annotations

import functools
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


# --- what CI ships: every kustomization rendered by kubectl kustomize ----------------------------------

KUBECTL_BIN = REPO / ".tools" / "kubectl" / "bin" / "kubectl"   # scripts/install-tools.sh


BASES = {"monitoring", "service"}   # parts of the overlays, with no Prometheus' label of their own


def overlays() -> list[Path]:
    """Every kustomization that builds on its own (components only build inside one)."""
    return sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml")
                  if yaml.safe_load(p.read_text()).get("kind", "Kustomization") == "Kustomization")


def kubectl() -> str:
    if KUBECTL_BIN.is_file():
        return str(KUBECTL_BIN)
    return find_tool("kubectl")


@functools.cache
def rendered(directory: Path) -> tuple[dict, ...]:
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {directory.relative_to(REPO)}: {out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


@pytest.mark.parametrize("directory", overlays(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_overlay_renders_and_its_output_is_valid(directory: Path) -> None:
    docs = rendered(directory)
    assert docs
    for doc in docs:
        test_manifest_is_valid(directory, doc)
        if doc["kind"] in CRD_MODELS and directory.name not in BASES:
            # the label kube-prometheus-stack's Prometheus selects by, from components/kube-prometheus-stack
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack", doc["metadata"]["name"]


def test_rendered_overlays_select_their_own_pods() -> None:
    for directory in overlays():
        docs = rendered(directory)
        pods = [d["spec"]["template"] for d in docs if d["kind"] == "Deployment"]
        monitors = [d for d in docs if d["kind"] in ("PodMonitor", "ServiceMonitor")]
        if pods:   # an overlay with its own engine: its monitor finds that pod and its port
            assert len(monitors) == 1, directory
            [monitor] = monitors
            [pod] = pods
            if monitor["kind"] == "PodMonitor":
                assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
                ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
                assert all(e["port"] in ports for e in monitor["spec"]["podMetricsEndpoints"])


def test_the_validators_refuse_a_broken_render(tmp_path: Path) -> None:
    """A kustomization kubectl cannot build (a file outside its root: what export-sidecar did before)
    fails the render, so the test above does test something."""
    (tmp_path / "outside.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "kustomization.yaml").write_text("resources:\n  - ../outside.yaml\n")
    out = subprocess.run([kubectl(), "kustomize", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "not in or below" in out.stderr


# The per-stack values in docs/kubernetes.md: the pod labels and port each stack's PodMonitor expects.
STACK_PODS = {
    "production-stack": ({"helm-release-name": "vllm", "model": "llama3"}, {}),
    "llm-d": ({"llm-d.ai/inferenceServing": "true", "llm-d.ai/role": "decode"}, {"metrics": 8200, "kvwatch-metrics": 9400}),
    "kserve": ({"serving.kserve.io/inferenceservice": "llama3", "app.kubernetes.io/name": "vllm"}, {"http1": 8080}),
}


@pytest.mark.parametrize("stack", sorted(STACK_PODS))
def test_stack_monitors_select_the_stacks_pods(stack: str) -> None:
    labels, ports = STACK_PODS[stack]
    [monitor] = [d for d in rendered(DEPLOY / "stacks" / stack) if d["kind"] == "PodMonitor"]
    selector = monitor["spec"]["selector"]
    assert selector.get("matchLabels", {}).items() <= labels.items()
    assert all(e["key"] in labels for e in selector.get("matchExpressions", []) if e["operator"] == "Exists")
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint.get("port") in ports or endpoint.get("targetPort") == 9400   # kvwatch's port, never vLLM's
        assert endpoint.get("port") != "metrics"
