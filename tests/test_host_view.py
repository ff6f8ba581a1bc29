"""Several engines on one host: each kvwatch knows the engines the others watch (the shared state
directory), exports the GPUs its own engine uses, and counts as foreign only memory no engine holds.

Everything is real but the GPU driver: the engines are real processes (tests/fake_engine.py, serving
/health and /metrics with a child process like vLLM's EngineCore), the kvwatch instances are real
`kvwatch export` / `kvwatch run` processes sharing one state directory, and NVML is the stand-in
library, whose per-GPU process lists name the engines' real pids.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from engine_support import free_port, http_get
from exporter_support import samples, value
from nvml_standin import (
    GIB,
    NvmlStandin,
    StandinGpu,
    StandinProcess,
    StandinState,
)
from waiting import eventually

from kvwatch.watchdog.host_registry import HostRegistry

REPO = Path(__file__).resolve().parents[1]
FAKE = str(REPO / "tests" / "fake_engine.py")
GPU0 = "GPU-5a1e0000-0000-4000-8000-000000000000"
GPU1 = "GPU-5a1e0000-0000-4000-8000-000000000001"


def host_state(held: dict[str, list[tuple[int, int]]]) -> StandinState:
    """Two 80 GiB GPUs; `held` maps a GPU to (pid, bytes) of its compute processes."""
    return StandinState(gpus=[
        StandinGpu(uuid=uuid, memory_total_bytes=80 * GIB,
                   memory_used_bytes=sum(b for _, b in held.get(uuid, [])),
                   processes=[StandinProcess(pid, b) for pid, b in held.get(uuid, [])])
        for uuid in (GPU0, GPU1)])


class Engine:
    """A fake engine process (and its EngineCore-like child) with its own CUDA_VISIBLE_DEVICES."""

    def __init__(self, model: Path, visible: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, FAKE, "--model", str(model), "--port", str(self.port)],
                                     env={**os.environ, "CUDA_VISIBLE_DEVICES": visible},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        def up() -> bool:
            assert self.proc.poll() is None, "fake engine did not start"
            return http_get(self.url + "/health", timeout=1)[0] == 200
        assert eventually(up, 30, interval=0.1), "fake engine did not start"

    @property
    def worker(self) -> int:
        """The child process: where vLLM's GPU memory lives (its EngineCore/worker)."""
        return psutil.Process(self.proc.pid).children()[0].pid

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


@contextmanager
def exporters(nvml_standin: NvmlStandin, state_dir: Path, engines: dict[str, Engine]) -> Iterator[dict[str, str]]:
    """One `kvwatch export` per engine, no --engine-pid (found by its port), one shared state dir."""
    procs, urls = [], {}
    try:
        for name, engine in engines.items():
            port = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "kvwatch.cli", "export", "--engine-url", engine.url, "--name", name,
                 "--listen", f"127.0.0.1:{port}", "--interval", "0.3", "--state-dir", str(state_dir)],
                cwd=REPO, env={**os.environ, **nvml_standin.env}, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
            urls[name] = f"http://127.0.0.1:{port}"
        yield urls
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)


def settled(urls: dict[str, str], check, timeout: float = 30.0) -> dict[str, dict]:
    """Scrape every instance until `check(found_by_instance)` holds (each instance ticks on its own)."""
    found: dict[str, dict] = {}

    def holds() -> bool:
        nonlocal found
        found = {name: samples(http_get(url + "/metrics", timeout=2)[1]) for name, url in urls.items()}
        try:
            return bool(check(found))
        except (KeyError, TypeError):
            return False
    if eventually(holds, timeout, interval=0.2):
        return found
    raise AssertionError(f"not settled after {timeout}s: { {n: sorted(k[0] for k in f if 'gpu' in k[0]) for n, f in found.items()} }")


def gpus_exported(found: dict) -> set[str]:
    return {dict(labels)["gpu"] for name, labels in found if name == "kvwatch_gpu_memory_total_bytes"}


def both_claims(engines_dir: Path, names: set[str]) -> dict[str, dict]:
    """The claim files by engine name once every name has one, else {} (to wait on)."""
    claims = {p.stem: json.loads(p.read_text()) for p in engines_dir.glob("*.json")}
    return claims if names <= claims.keys() else {}


def test_two_exporters_on_two_gpus_see_each_other(tmp_path: Path, nvml_standin: NvmlStandin, tiny: Path) -> None:
    """Issue's scenario: engine a 30 GiB on GPU 0, engine b 40 GiB on GPU 1, an unrelated 1 GiB on GPU 1."""
    a, b = Engine(tiny, "0"), Engine(tiny, "1")
    unrelated = subprocess.Popen(["sleep", "300"])
    try:
        nvml_standin.write(host_state({GPU0: [(a.worker, 30 * GIB)],
                                       GPU1: [(b.worker, 40 * GIB), (unrelated.pid, 1 * GIB)]}))
        with exporters(nvml_standin, tmp_path / "state", {"a": a, "b": b}) as urls:
            found = settled(urls, lambda f: value(f["a"], "kvwatch_gpu_foreign_memory_bytes", gpu=GPU0) == 0
                            and value(f["b"], "kvwatch_gpu_foreign_memory_bytes", gpu=GPU1) == 1 * GIB
                            and value(f["a"], "kvwatch_engine_gpu_memory_bytes", engine="a", rank="0", gpu=GPU0)
                            == 30 * GIB)
            assert gpus_exported(found["a"]) == {GPU0} and gpus_exported(found["b"]) == {GPU1}
            assert value(found["b"], "kvwatch_engine_gpu_memory_bytes", engine="b", rank="0", gpu=GPU1) == 40 * GIB
            assert value(found["a"], "kvwatch_collector_success", collector="host") == 1
            # each claims its engine in the shared directory; the claim is written off the watch
            # loop, so on a loaded box it may land after the metrics do
            claims = eventually(lambda: both_claims(tmp_path / "state" / "engines", {"a", "b"}), timeout=10)
            assert claims, "both exporters' claim files within 10 s"
            assert a.worker in [pid for pid, _ in claims["a"]["pids"]] and a.proc.pid in [pid for pid, _ in claims["a"]["pids"]]
        assert not list((tmp_path / "state" / "engines").glob("*.json"))   # withdrawn at exit
    finally:
        unrelated.kill()
        unrelated.wait()
        a.stop()
        b.stop()


def test_two_engines_sharing_one_gpu(tmp_path: Path, nvml_standin: NvmlStandin, tiny: Path) -> None:
    """Two engines at --gpu-memory-utilization 0.45 on GPU 0: each its own memory, neither foreign."""
    a, b = Engine(tiny, "0"), Engine(tiny, "0")
    unrelated = subprocess.Popen(["sleep", "300"])
    try:
        nvml_standin.write(host_state({GPU0: [(a.worker, 20 * GIB), (b.worker, 25 * GIB)],
                                       GPU1: [(unrelated.pid, 1 * GIB)]}))
        with exporters(nvml_standin, tmp_path / "state", {"a": a, "b": b}) as urls:
            found = settled(urls, lambda f: value(f["a"], "kvwatch_gpu_foreign_memory_bytes", gpu=GPU0) == 0
                            and value(f["b"], "kvwatch_gpu_foreign_memory_bytes", gpu=GPU0) == 0)
            assert gpus_exported(found["a"]) == gpus_exported(found["b"]) == {GPU0}
            assert value(found["a"], "kvwatch_engine_gpu_memory_bytes", engine="a", rank="0", gpu=GPU0) == 20 * GIB
            assert value(found["b"], "kvwatch_engine_gpu_memory_bytes", engine="b", rank="0", gpu=GPU0) == 25 * GIB
            assert value(found["a"], "kvwatch_engine_gpu_memory_bytes", engine="b", rank="0", gpu=GPU0) is None
    finally:
        unrelated.kill()
        unrelated.wait()
        a.stop()
        b.stop()


def test_a_host_wide_owner_exports_every_gpu(tmp_path: Path, nvml_standin: NvmlStandin, tiny: Path) -> None:
    """--all-gpus: one instance exports every GPU (one with no engine too), foreign still host-wide."""
    a = Engine(tiny, "0")
    unrelated = subprocess.Popen(["sleep", "300"])
    try:
        nvml_standin.write(host_state({GPU0: [(a.worker, 30 * GIB)], GPU1: [(unrelated.pid, 1 * GIB)]}))
        port = free_port()
        owner = subprocess.Popen(
            [sys.executable, "-m", "kvwatch.cli", "export", "--engine-url", a.url, "--name", "a", "--all-gpus",
             "--listen", f"127.0.0.1:{port}", "--interval", "0.3", "--state-dir", str(tmp_path / "state")],
            cwd=REPO, env={**os.environ, **nvml_standin.env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            found = settled({"a": f"http://127.0.0.1:{port}"},
                            lambda f: value(f["a"], "kvwatch_gpu_foreign_memory_bytes", gpu=GPU1) == 1 * GIB)
            assert gpus_exported(found["a"]) == {GPU0, GPU1}
            assert value(found["a"], "kvwatch_gpu_foreign_memory_bytes", gpu=GPU0) == 0
        finally:
            owner.send_signal(signal.SIGTERM)
            owner.wait(timeout=30)
    finally:
        unrelated.kill()
        unrelated.wait()
        a.stop()


RUN_CONFIG = """
[engine]
command = {command}
environment = {{ CUDA_VISIBLE_DEVICES = "{visible}" }}
start_timeout_seconds = 30
health_interval_seconds = 0.5
hang_timeout_seconds = 10
stop_timeout_seconds = 5

[watch]
interval_seconds = 0.3
"""


def test_two_kvwatch_runs_sharing_a_state_directory(tmp_path: Path, nvml_standin: NvmlStandin, tiny: Path) -> None:
    state = tmp_path / "state"
    runs, urls = {}, {}
    unrelated = subprocess.Popen(["sleep", "300"])
    try:
        for name, visible in (("a", "0"), ("b", "1")):
            config = tmp_path / f"{name}.toml"
            command = [sys.executable, FAKE, "--model", str(tiny), "--port", str(free_port())]
            config.write_text(RUN_CONFIG.format(command=json.dumps(command), visible=visible))
            port = free_port()
            runs[name] = subprocess.Popen(
                [sys.executable, "-m", "kvwatch.cli", "run", "--config", str(config), "--name", name,
                 "--state-dir", str(state), "--listen", f"127.0.0.1:{port}"],
                cwd=REPO, env={**os.environ, **nvml_standin.env}, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
            urls[name] = f"http://127.0.0.1:{port}"
        workers = {}

        def both_ready() -> bool:
            for name in ("a", "b"):
                try:
                    data = json.loads((state / f"{name}.json").read_text())
                except (OSError, ValueError):
                    continue
                if data.get("state") == "ready" and len(data["pids"]) >= 2:
                    workers[name] = data["pids"][-1]["pid"]
            return len(workers) >= 2
        eventually(both_ready, 60, interval=0.2)
        assert len(workers) == 2, "the two supervised fake engines did not get ready"
        nvml_standin.write(host_state({GPU0: [(workers["a"], 30 * GIB)],
                                       GPU1: [(workers["b"], 40 * GIB), (unrelated.pid, 1 * GIB)]}))
        found = settled(urls, lambda f: value(f["a"], "kvwatch_gpu_foreign_memory_bytes", gpu=GPU0) == 0
                        and value(f["b"], "kvwatch_gpu_foreign_memory_bytes", gpu=GPU1) == 1 * GIB)
        assert gpus_exported(found["a"]) == {GPU0} and gpus_exported(found["b"]) == {GPU1}
        assert value(found["a"], "kvwatch_engine_gpu_memory_bytes", engine="a", rank="0", gpu=GPU0) == 30 * GIB
        assert value(found["b"], "kvwatch_engine_gpu_memory_bytes", engine="b", rank="0", gpu=GPU1) == 40 * GIB
    finally:
        for proc in runs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in runs.values():
            proc.wait(timeout=60)
        unrelated.kill()
        unrelated.wait()


# -- the registry itself -------------------------------------------------------------------

def test_registry_claims_lapse_with_their_kvwatch(tmp_path: Path) -> None:
    engine = subprocess.Popen(["sleep", "300"])
    try:
        mine, theirs = HostRegistry(str(tmp_path), "mine"), HostRegistry(str(tmp_path), "theirs")
        theirs.publish([engine.pid])
        assert theirs.flush(5)                        # the claim is written off the caller's thread
        assert mine.others() == {engine.pid} and theirs.others() == frozenset()
        # a claim written by a kvwatch that is gone (a pid that does not run with that start time)
        path = tmp_path / "engines" / "theirs.json"
        data = json.loads(path.read_text())
        data["kvwatch"] = [data["kvwatch"][0], data["kvwatch"][1] - 1000]
        path.write_text(json.dumps(data))
        assert mine.others() == frozenset()
        theirs.publish([engine.pid, engine.pid])      # unchanged claim: not rewritten
        assert theirs.flush(5)
        assert json.loads(path.read_text())["kvwatch"] == data["kvwatch"]
        theirs.withdraw()
        assert not path.exists()
    finally:
        engine.kill()
        engine.wait()


def test_registry_ignores_what_it_must_not_read(tmp_path: Path) -> None:
    mine = HostRegistry(str(tmp_path), "mine")
    d = tmp_path / "engines"
    d.mkdir()
    (d / "garbage.json").write_text("{not json")
    (d / "huge.json").write_text(" " * 100_000)
    (d / "list.json").write_text("[1, 2]")
    (d / "link.json").symlink_to("/dev/zero")
    os.mkfifo(d / "fifo.json")
    (d / "wrong.json").write_text(json.dumps({"kvwatch": [os.getpid(), "x"], "pids": [["1", 2]]}))
    assert mine.others() == frozenset()       # and it did not hang on the FIFO


# -- the real Prometheus over two instances ------------------------------------------------------

def test_prometheus_two_instances_one_series_per_gpu_and_the_foreign_alert(tmp_path: Path, nvml_standin: NvmlStandin,
                                                                           tiny: Path) -> None:
    """Two kvwatch instances, both engines on GPU 0: KvwatchForeignGpuMemory silent; an unrelated process
    taking 10 % of GPU 0 makes it fire, once; every GPU memory panel expression gives one series per GPU."""
    from operator_tools import grafana_expr_to_promql
    from prometheus_support import prometheus_server, rules_with_short_for

    a, b = Engine(tiny, "0"), Engine(tiny, "0")
    unrelated = subprocess.Popen(["sleep", "300"])
    try:
        nvml_standin.write(host_state({GPU0: [(a.worker, 20 * GIB), (b.worker, 25 * GIB)]}))
        with exporters(nvml_standin, tmp_path / "state", {"a": a, "b": b}) as urls:
            settled(urls, lambda f: all(value(f[n], "kvwatch_gpu_foreign_memory_bytes", gpu=GPU0) == 0 for n in f))
            targets = [u.removeprefix("http://") for u in urls.values()]
            rules = rules_with_short_for(tmp_path / "rules.yml", 2)
            with prometheus_server(tmp_path / "prometheus", targets, rules) as prom:
                eventually(lambda: len(prom.query("kvwatch_gpu_memory_total_bytes")) >= 2, 60, 0.5)
                assert len(prom.query("kvwatch_gpu_memory_total_bytes")) == 2    # both instances export GPU 0
                time.sleep(5)   # rules evaluated a few times, past the short `for:`
                assert not [x for x in prom.firing_alerts() if x["labels"]["alertname"] == "KvwatchForeignGpuMemory"]
                dashboard = json.loads((REPO / "dashboards" / "kvwatch.json").read_text())
                panel = next(p for p in dashboard["panels"] if p.get("title", "").startswith("GPU memory:"))
                for target in panel["targets"]:
                    result = prom.query(grafana_expr_to_promql(target["expr"]))
                    keys = [(r["metric"].get("gpu"), r["metric"].get("engine")) for r in result]
                    assert keys and len(keys) == len(set(keys)), (target["expr"], keys)   # once per GPU (and engine)
                total = prom.query(f'kvwatch:gpu_memory_engine_bytes{{gpu="{GPU0}"}}')
                assert [float(r["value"][1]) for r in total] == [45 * GIB]

                nvml_standin.write(host_state({GPU0: [(a.worker, 20 * GIB), (b.worker, 25 * GIB),
                                                      (unrelated.pid, 8 * GIB)]}))
                firing = eventually(lambda: [x for x in prom.firing_alerts()
                                             if x["labels"]["alertname"] == "KvwatchForeignGpuMemory"], 60, 0.5)
                assert [x["labels"]["gpu"] for x in firing] == [GPU0]
                assert "instance" not in firing[0]["labels"]       # one alert per GPU, not per instance
    finally:
        unrelated.kill()
        unrelated.wait()
        a.stop()
        b.stop()


def test_export_says_when_it_cannot_find_the_engines_processes(caplog: pytest.LogCaptureFixture) -> None:
    from kvwatch.exporter.targets import external_engine
    port = free_port()                     # nobody listens there
    engines = external_engine("x", f"http://127.0.0.1:{port}", find_processes=True)
    with caplog.at_level("WARNING"):
        [target] = engines()
        engines()
    assert target.status.pids == () and not target.pids_known
    said = [r.getMessage() for r in caplog.records if "cannot tell which processes" in r.getMessage()]
    assert len(said) == 1 and "--engine-pid" in said[0]          # once, not every tick


def test_export_finds_the_engine_by_its_port(tmp_path: Path, tiny: Path) -> None:
    from kvwatch.exporter.targets import external_engine
    engine = Engine(tiny, "3")
    try:
        [target] = external_engine("x", engine.url, find_processes=True)()
        assert set(target.status.pids) == {engine.proc.pid, engine.worker}
        assert target.pids_known and target.visible_devices == "3"
    finally:
        engine.stop()


def test_a_flood_of_big_claims_costs_one_look_at_each_running_process(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """256 claims of 4,095 pids each (26 s a tick before): every running pid's start time is read
    at most once a tick, a pid that does not run costs no lookup, an unchanged claim no parse."""
    from kvwatch.boundary import proc_inspect

    engine = subprocess.Popen(["sleep", "300"])
    try:
        theirs = HostRegistry(str(tmp_path), "theirs")
        theirs.publish([engine.pid])
        assert theirs.flush(10)
        me = proc_inspect.ref_of(os.getpid())
        assert me is not None
        d = tmp_path / "engines"
        for i in range(255):          # forged claims, each naming a live "kvwatch" (this process)
            pids = [[pid, 1] for pid in range(2, 4097)]
            (d / f"flood{i:03}.json").write_text(json.dumps({"kvwatch": [me.pid, me.create_time], "pids": pids},
                                                            separators=(",", ":")))
        lookups = {"n": 0}
        for name in ("create_time", "is_same"):
            real = getattr(proc_inspect, name)

            def counted(*args: object, _real=real) -> object:
                lookups["n"] += 1
                return _real(*args)
            monkeypatch.setattr(proc_inspect, name, counted)
        mine = HostRegistry(str(tmp_path), "mine")
        running = len(psutil.pids())
        assert mine.others() == {engine.pid}
        assert lookups["n"] <= running + 10, lookups
        parsed = dict(mine._claims)
        assert mine.others() == {engine.pid}
        assert all(mine._claims[p][1] is parsed[p][1] for p in parsed)     # unchanged: not parsed again
    finally:
        engine.kill()
        engine.wait()


def test_an_instance_alone_on_its_host_lists_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process table is listed (once a tick) only when another instance's claim is there to check."""
    from kvwatch.boundary import proc_inspect

    listings = {"n": 0}
    real = proc_inspect.running_pids

    def counted() -> frozenset[int]:
        listings["n"] += 1
        return real()
    monkeypatch.setattr(proc_inspect, "running_pids", counted)
    engine = subprocess.Popen(["sleep", "300"])
    try:
        mine = HostRegistry(str(tmp_path), "mine")
        mine.publish([engine.pid])
        assert mine.flush(10)
        assert mine.others() == frozenset() and listings["n"] == 0
        theirs = HostRegistry(str(tmp_path), "theirs")
        theirs.publish([engine.pid])
        assert theirs.flush(10)
        assert mine.others() == {engine.pid} and listings["n"] == 1
    finally:
        engine.kill()
        engine.wait()
