"""Several kvwatch instances on one GPU host (issue 12): CPU and RSS of 8 `kvwatch export` instances,
one per engine on an 8-GPU host, side by side with 1 instance, at the default interval (5 s).
Bar: the host's kvwatch total under 2 % of one core.

The host is the NVML stand-in (tests/nvml_standin, a real libnvidia-ml.so.1) with 8 H200s. Each
engine is a real process (`sleep`) holding 90 GiB of its GPU, plus an HTTP stand-in serving a
/metrics page captured from the real CPU engine (tests/fixtures/metrics/cpu_block64.txt) with its
model, so planned/actual KV figures are computed every tick. The instances share one state
directory, so each reads the other seven's claims every tick (the `host` collector). Each instance
is scraped every 15 s, as Prometheus would.

Both setups run in this one process, one after the other: first 1 instance (engine 0, `--all-gpus`:
the single-instance way to see the whole host), then 8 (engine g on GPU g). CPU is user+system time
over the measured window (after a warm-up) / wall time, summed over the instances; RSS is each
instance's resident memory at the end, summed.

Run: .venv/bin/python bench/bench_host.py [--seconds 60]
"""
from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bench_overhead import Engine, get  # noqa: E402  (the same engine stand-in and scraper)
from engine_support import free_port  # noqa: E402
from nvml_standin import GIB, StandinGpu, StandinProcess, StandinState, standin_library  # noqa: E402

METRICS = ROOT / "tests" / "fixtures" / "metrics"
BAR_CPU = 0.02
GPUS = 8
SCRAPE_EVERY = 15.0


def measure(instances: list[list[str]], env: dict[str, str], seconds: int, ready_needle: str) -> tuple[float, int, int]:
    """Start the instances, warm up, measure: (CPU fraction of a core summed, RSS bytes summed, series)."""
    procs, urls = [], []
    for argv in instances:
        port = free_port()
        cut = argv.index("--")   # the engine's command follows: kvwatch's flags go before it
        procs.append(subprocess.Popen([*argv[:cut], "--listen", f"127.0.0.1:{port}", *argv[cut:]], cwd=ROOT,
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}/metrics")
    try:
        deadline = time.monotonic() + 120
        while not all(ready_needle in get(u) for u in urls):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("kvwatch instances did not come up")
            time.sleep(0.5)
        time.sleep(12)  # warm-up: imports done, a couple of ticks behind
        ps = [psutil.Process(p.pid) for p in procs]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in ps)
        start = time.monotonic()
        series = 0
        next_scrape = start
        while time.monotonic() - start < seconds:
            if time.monotonic() >= next_scrape:
                series = sum(sum(1 for line in get(u).splitlines() if line and not line.startswith("#")) for u in urls)
                next_scrape += SCRAPE_EVERY
            time.sleep(0.5)
        wall = time.monotonic() - start
        cpu = (sum(sum(p.cpu_times()[:2]) for p in ps) - cpu0) / wall
        rss = sum(p.memory_info().rss for p in ps)
        return cpu, rss, series
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=60)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-host-"))
    workers = [subprocess.Popen(["sleep", "100000"]) for _ in range(GPUS)]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        library = standin_library()
        state = tmp / "nvml-state.txt"
        StandinState(gpus=[StandinGpu(uuid=f"GPU-{g:08d}-0000-4000-8000-000000000000", name="NVIDIA H200",
                                      memory_total_bytes=141 * GIB, memory_used_bytes=91 * GIB,
                                      processes=[StandinProcess(workers[g].pid, 90 * GIB)])
                           for g in range(GPUS)]).write(state)
        model = tmp / "model"
        model.mkdir()
        shutil.copy(METRICS / "cpu_block64.config.json", model / "config.json")
        argv = json.loads((METRICS / "cpu_block64.argv.json").read_text())
        engine_url = f"http://127.0.0.1:{server.server_address[1]}"
        env = {**os.environ, "NVML_STANDIN_STATE": str(state), "KVWATCH_NVML_LIBRARY": str(library)}

        def instance(g: int, *extra: str) -> list[str]:
            return [sys.executable, "-m", "kvwatch.cli", "export", "--engine-url", engine_url, "--name", f"e{g}",
                    "--model", str(model), "--device", "cpu", "--engine-pid", str(workers[g].pid),
                    "--state-dir", str(tmp / "state"), *extra, "--", "vllm", "serve", str(model), *argv]

        needle = "kvwatch_gpu_info{gpu="
        one_cpu, one_rss, one_series = measure([instance(0, "--all-gpus")], env, args.seconds, needle)
        all_cpu, all_rss, all_series = measure([instance(g) for g in range(GPUS)], env, args.seconds, needle)
    finally:
        server.shutdown()
        for w in workers:
            w.kill()
            w.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{GPUS} GPUs (NVML stand-in), default interval 5 s, a scrape every {SCRAPE_EVERY:.0f} s, "
          f"{args.seconds} s measured; load average at the end {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'setup':<34}{'CPU % of a core':>16}{'RSS MB':>10}{'series':>9}")
    print(f"{'1 instance (--all-gpus)':<34}{one_cpu * 100:16.2f}{one_rss / 2**20:10.1f}{one_series:9d}")
    print(f"{f'{GPUS} instances (one per engine)':<34}{all_cpu * 100:16.2f}{all_rss / 2**20:10.1f}{all_series:9d}")
    print(f"{GPUS} instances / 1 instance: CPU x{all_cpu / one_cpu:.2f}, RSS x{all_rss / one_rss:.2f}")
    print(f"bar: the host's kvwatch total < {BAR_CPU * 100:.0f} % of a core: {'PASS' if all_cpu < BAR_CPU else 'MISS'}")


if __name__ == "__main__":
    main()
