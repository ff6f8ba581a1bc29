"""A real Prometheus server on loopback for end-to-end tests (Debian's binary from .tools)."""
from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine_support import free_port, http_get
from operator_tools import RULES_FILE, find_tool
from waiting import eventually


def rules_with_short_for(target: Path, seconds: int) -> Path:
    """A copy of the rules whose `for:` durations are `seconds`: a test cannot wait 15 minutes.
    promtool's unit tests (test_alerts.py) check the real durations."""
    text = re.sub(r"(\n\s+for:\s*)\S+", rf"\g<1>{seconds}s", RULES_FILE.read_text())
    target.write_text(text)
    return target


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen
    log_path: Path

    def query(self, expr: str) -> list[dict]:
        qs = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{qs}", timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def firing_alerts(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/api/v1/alerts", timeout=10) as resp:
            alerts = json.load(resp)["data"]["alerts"]
        return [a for a in alerts if a["state"] == "firing"]

    def targets_up(self) -> bool:
        return any(float(r["value"][1]) == 1 for r in self.query("up"))


@contextmanager
def prometheus_server(workdir: Path, targets: list[str], rules: Path | None = None,
                      scrape_interval: str = "1s") -> Iterator[Prometheus]:
    binary = find_tool("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    rule_files = f"rule_files: [{json.dumps(str(rules))}]\n" if rules else ""
    config = workdir / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {scrape_interval}, evaluation_interval: {scrape_interval}}}\n"
        f"{rule_files}"
        "scrape_configs:\n"
        "  - job_name: kvwatch\n"
        f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n")
    port = free_port()
    log_path = workdir / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus did not start:\n{log_path.read_text()[-3000:]}")
            return http_get(server.url + "/-/ready")[0] == 200
        if not eventually(ready, 60, interval=0.3):
            raise RuntimeError(f"prometheus did not start:\n{log_path.read_text()[-3000:]}")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
