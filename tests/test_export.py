"""`kvwatch export` as a subprocess and the supervised-engine source, against a stand-in
engine that serves a /metrics page captured from the real CPU engine. (The real engine
itself: test_export_e2e.py.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from engine_standin import Route, serve_routes
from engine_support import free_port, http_get
from exporter_support import METRICS, fixture_plan, render, samples, value
from nvml_standin import (
    GIB,
    NvmlStandin,
    StandinGpu,
    StandinProcess,
    StandinState,
)
from operator_tools import readme_metric_labels
from waiting import eventually

from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exporter.targets import SupervisedEngines
from kvwatch.exporter.watch import Watch

REPO = Path(__file__).resolve().parents[1]
PIPELINE_GOLDEN = REPO / "tests" / "fixtures" / "golden" / "export_pipeline.txt"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[str, dict[str, Route], Path]]:
    """A stand-in engine serving the cpu_block64 page, and that run's model directory."""
    routes: dict[str, Route] = {"/health": (200, b"", 0.0),
                                "/metrics": (200, (METRICS / "cpu_block64.txt").read_bytes(), 0.0)}
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((METRICS / "cpu_block64.config.json").read_text())
    with serve_routes(routes) as url:
        yield url, routes, model


_STATE = tempfile.mkdtemp(prefix="kvwatch-test-state-")   # never the host's own state directory


def kvwatch(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvwatch.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "STATE_DIRECTORY": _STATE, **(env or {})})


def scrape_when_ready(url: str, proc: subprocess.Popen, timeout: float = 30) -> str:
    def served() -> str | None:
        status, body = http_get(url + "/metrics", timeout=2)
        if status == 200:
            return body
        if proc.poll() is not None:
            raise AssertionError(f"kvwatch export exited {proc.returncode}: {proc.stdout.read()}")  # type: ignore[union-attr]
        return None
    body = eventually(served, timeout, interval=0.2)
    if body is None:
        raise AssertionError("kvwatch export never served /metrics")
    return body


def scrape_until(url: str, done: Callable[[dict], bool], timeout: float = 10) -> dict:
    """The samples of kvwatch's first page for which `done` holds; the last page read otherwise."""
    last: dict = {}

    def read() -> bool:
        nonlocal last
        last = samples(http_get(url + "/metrics")[1])
        return done(last)
    eventually(read, timeout, interval=0.2)
    return last


def test_export_an_external_engine(engine) -> None:
    url, routes, model = engine
    port = free_port()
    proc = kvwatch("export", "--engine-url", url, "--name", "ext", "--model", str(model), "--device", "cpu",
                   "--listen", f"127.0.0.1:{port}", "--interval", "0.2", "--no-nvml")
    try:
        found = samples(scrape_when_ready(f"http://127.0.0.1:{port}", proc))
        assert value(found, "kvwatch_engine_up", engine="ext") == 1
        assert value(found, "kvwatch_engine_state", engine="ext", state="ready") == 1
        assert value(found, "kvwatch_kv_actual_blocks", engine="ext", rank="0") == 21_845
        assert value(found, "kvwatch_kv_planned_blocks", engine="ext", rank="0") == 21_845
        assert value(found, "kvwatch_kv_plan_drift_ratio", engine="ext", rank="0") == 0
        assert value(found, "kvwatch_kv_padding_bytes", engine="ext", rank="0", cause="remainder") == 16_384
        assert value(found, "kvwatch_collector_success", collector="nvml") is None  # --no-nvml
        routes["/health"] = (503, b"", 0.0)  # the engine dies: kvwatch does not restart it, so it stays "ready"
        found = scrape_until(f"http://127.0.0.1:{port}", lambda f: value(f, "kvwatch_engine_up", engine="ext") == 0)
        assert value(found, "kvwatch_engine_up", engine="ext") == 0
        assert value(found, "kvwatch_engine_state", engine="ext", state="ready") == 1
        assert value(found, "kvwatch_kv_actual_blocks", engine="ext", rank="0") is None  # gone with the engine
        assert value(found, "kvwatch_collector_success", collector="engine") == 1  # down is not a failure
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
        proc.wait()


def test_export_without_a_model_has_no_kv_figures(engine) -> None:
    url, _, _ = engine
    port = free_port()
    proc = kvwatch("export", "--engine-url", url, "--listen", f"127.0.0.1:{port}", "--interval", "0.2",
                   "--no-nvml")
    try:
        found = samples(scrape_when_ready(f"http://127.0.0.1:{port}", proc))
        assert value(found, "kvwatch_engine_up", engine="vllm") == 1
        assert value(found, "kvwatch_kv_usage_ratio", engine="vllm", rank="0") == 0
        assert not [n for n, _ in found if n.startswith(("kvwatch_kv_planned", "kvwatch_kv_actual"))]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_signal_taken_by_another_thread_reaches_the_main_one(engine, sig: int) -> None:
    """The main thread sleeps until a signal, not looking every half second: a signal the kernel
    hands to another thread (the watch loop's) wakes it all the same. SIGHUP is ignored, SIGTERM stops."""
    import ctypes

    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if tgkill is None:
        pytest.skip("no tgkill in this libc")
    url, _, _ = engine
    port = free_port()
    proc = kvwatch("export", "--engine-url", url, "--listen", f"127.0.0.1:{port}", "--interval", "0.2", "--no-nvml")
    try:
        scrape_when_ready(f"http://127.0.0.1:{port}", proc)
        threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
        assert threads and tgkill(proc.pid, threads[0], sig) == 0
        if sig == signal.SIGHUP:
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
            assert http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200
            assert tgkill(proc.pid, threads[0], signal.SIGTERM) == 0
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("args,message", [
    (["--engine-url", "localhost:8000"], "expected http://HOST:PORT"),
    (["--engine-url", "http://127.0.0.1:99999"], "expected http://HOST:PORT"),   # was a ValueError traceback
    (["--engine-url", "http://127.0.0.1:abc"], "expected http://HOST:PORT"),
    (["--engine-url", "http://:8000"], "expected http://HOST:PORT"),              # was accepted, never scraped
    (["--engine-url", "http://127.0.0.1:1", "--interval", "0"], "--interval"),
    (["--engine-url", "http://127.0.0.1:1", "--listen", "nowhere"], "listen 'nowhere': expected HOST:PORT"),
    (["--engine-url", "http://127.0.0.1:1", "--web-config", "/nonexistent/web.yml"], "cannot read"),
    (["--engine-url", "http://127.0.0.1:1", "--model", "/nonexistent/model", "--device", "cpu"], "model"),
    ([], "--engine-url"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = kvwatch("export", "--no-nvml", *args)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    lines = [line for line in out.splitlines() if line.strip() and "kvwatch INFO" not in line]
    assert len(lines) <= 2 and message in out and "Traceback" not in out, out


def test_supervised_engines_take_url_and_model_from_the_command(engine) -> None:
    """`kvwatch run`'s source: URL from --host/--port, geometry from the model's config.json."""
    url, _, model = engine
    port = url.rsplit(":", 1)[1]
    argv = ("vllm", "serve", str(model), "--block-size", "64", "--host", "127.0.0.1", "--port", port)
    status = EngineStatus("sup", EngineState.READY, plan=fixture_plan("cpu_block64"), argv=argv, pids=(1,),
                          log_kv_tokens=1_398_080)
    statuses = [status]
    watch = Watch(SupervisedEngines(lambda: statuses))
    snap = watch.tick()
    assert snap.engines[0].actual is not None and snap.engines[0].actual.problems == ()
    found = samples(render(watch))
    assert value(found, "kvwatch_engine_up", engine="sup") == 1
    assert value(found, "kvwatch_kv_actual_bytes", engine="sup", rank="0") == value(found, "kvwatch_kv_planned_bytes", engine="sup", rank="0")
    assert value(found, "kvwatch_engine_state", engine="sup", state="ready") == 1  # the supervisor's state
    statuses[0] = EngineStatus("sup", EngineState.BACKOFF, plan=status.plan, argv=argv)
    assert value(samples(render(watch.tick() and watch)), "kvwatch_engine_state", engine="sup", state="backoff") == 1


def test_supervised_engine_with_an_unreadable_model_still_exports(tmp_path: Path) -> None:
    argv = ("vllm", "serve", str(tmp_path / "gone"), "--port", "1")
    watch = Watch(SupervisedEngines(lambda: [EngineStatus("x", EngineState.STARTING, plan=fixture_plan("cpu_default"),
                                                          argv=argv)]))
    found = samples(render(watch.tick() and watch))
    assert value(found, "kvwatch_engine_up", engine="x") == 0
    assert value(found, "kvwatch_kv_planned_blocks", engine="x", rank="0") == 16_384
    assert value(found, "kvwatch_kv_actual_bytes", engine="x", rank="0") is None


def test_export_an_external_data_parallel_engine(tmp_path: Path) -> None:
    """`kvwatch export` on the real DP 2 engine's series: the plan per rank from what the engine shows
    (1 GiB each), planned == actual on both ranks, no drift (before: actual 32,768 and drift 1.0)."""
    from engine_support import llama_config, write_model
    page = (METRICS / "cpu_dp2_excerpt.txt").read_bytes()
    model = write_model(tmp_path / "dp", llama_config())
    port = free_port()
    with serve_routes({"/health": (200, b"", 0.0), "/metrics": (200, page, 0.0)}) as url:
        proc = kvwatch("export", "--engine-url", url, "--name", "dp", "--model", str(model), "--device", "cpu",
                       "--listen", f"127.0.0.1:{port}", "--interval", "0.2", "--no-nvml")
        try:
            found = samples(scrape_when_ready(f"http://127.0.0.1:{port}", proc))
            if value(found, "kvwatch_kv_actual_blocks", engine="dp", rank="1") is None:
                found = scrape_until(f"http://127.0.0.1:{port}",
                                     lambda f: value(f, "kvwatch_kv_actual_blocks", engine="dp", rank="1") is not None)
            for rank in ("0", "1"):
                assert value(found, "kvwatch_kv_actual_blocks", engine="dp", rank=rank) == 16_384
                assert value(found, "kvwatch_kv_planned_blocks", engine="dp", rank=rank) == 16_384
                assert value(found, "kvwatch_kv_plan_drift_ratio", engine="dp", rank=rank) == 0
                assert value(found, "kvwatch_kv_usage_ratio", engine="dp", rank=rank) == 0
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


# Values that change from run to run: the version, how long each collector took, a live process's RSS.
_VOLATILE_VALUES = ("kvwatch_collector_duration_seconds{", "kvwatch_engine_process_resident_bytes{")


def normalised(page: str) -> str:
    out = []
    for line in page.splitlines():
        if line.startswith(_VOLATILE_VALUES):
            line = line.rsplit(" ", 1)[0] + " <volatile>"
        elif line.startswith("kvwatch_build_info{"):
            line = 'kvwatch_build_info{version="<version>"} 1.0'
        out.append(line)
    return "\n".join(out) + "\n"


def test_golden_page_of_the_real_pipeline(engine, nvml_standin: NvmlStandin) -> None:
    """`kvwatch export` end to end -- engine stand-in (the real CPU engine's page), NVML stand-in (the
    engine's process on one GPU beside a foreign one, a GPU it does not use), the engine's real
    process (its RSS) -- against a golden page with the volatile values normalised. The hand-built
    snapshot's golden (test_collector.py) pins the renderer; this one pins what the sources make of it."""
    url, _, model = engine
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items()
                                                                     if k != "CUDA_VISIBLE_DEVICES"})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        nvml_standin.write(StandinState(gpus=[
            StandinGpu(uuid="GPU-11111111-0000-4000-8000-000000000001", name="NVIDIA H200", compute_capability=(9, 0),
                       memory_total_bytes=141 * GIB, memory_used_bytes=60 * GIB,
                       processes=[StandinProcess(child.pid, 50 * GIB), StandinProcess(7777777, 9 * GIB)]),
            StandinGpu(uuid="GPU-22222222-0000-4000-8000-000000000002", name="NVIDIA H200", compute_capability=(9, 0),
                       memory_total_bytes=141 * GIB, memory_used_bytes=1 * GIB,
                       processes=[StandinProcess(7777778, 1 * GIB)]),
        ]))
        port = free_port()
        proc = kvwatch("export", "--engine-url", url, "--name", "ext", "--model", str(model), "--device", "cpu",
                       "--engine-pid", str(child.pid), "--listen", f"127.0.0.1:{port}", "--interval", "60",
                       env=nvml_standin.env)
        try:
            page = normalised(scrape_when_ready(f"http://127.0.0.1:{port}", proc))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
    finally:
        child.kill()
        child.wait()
    if os.environ.get("KVWATCH_UPDATE_GOLDEN"):
        PIPELINE_GOLDEN.write_text(page)
    assert page == PIPELINE_GOLDEN.read_text(), "the exported page changed: check it, then KVWATCH_UPDATE_GOLDEN=1"
    readme = readme_metric_labels()
    found = samples(page.replace("<volatile>", "0"))
    assert {name for name, _ in found} <= set(readme)
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="ext", rank="0",
                 gpu="GPU-11111111-0000-4000-8000-000000000001") == 50 * GIB
