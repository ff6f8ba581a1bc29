"""kvwatch's own cost on a GPU host: CPU and RSS of `kvwatch export --interval 1` over 60 s, next
to nvitop-exporter at the same interval, both scraped like Prometheus every second (issue 7,
item 5, second half; bar: kvwatch < 1 % of a core and < 60 MB RSS).

Both exporters see the same 8 GPUs: the NVML stand-in (tests/nvml_standin, a real
libnvidia-ml.so.1) with 8 H200s, each with a process on it. kvwatch gets it through
KVWATCH_NVML_LIBRARY; nvitop-exporter (nvidia-ml-py's plain CDLL("libnvidia-ml.so.1"))
through LD_LIBRARY_PATH. NVML calls the stand-in lacks (utilization, temperature, power, ...)
answer FunctionNotFound, which nvitop reports as N/A once and then skips. kvwatch also
watches an engine: a stand-in HTTP server in this process that serves a /metrics page
captured from the real CPU engine (tests/fixtures/metrics/cpu_block64.txt), with the model's
config, so the planned/actual KV figures are computed every tick.

CPU is each process's user+system time over the measured window (psutil, after a warm-up),
divided by the wall time; RSS is sampled every second (max and last printed).

nvitop-exporter lives in its own venv (kvwatch's is left alone):
    python3 -m venv /tmp/nvitop-venv && /tmp/nvitop-venv/bin/pip install nvitop-exporter
Run: .venv/bin/python bench/bench_overhead.py [--seconds 60] [--nvitop /tmp/nvitop-venv/bin/nvitop-exporter]
     [--kvwatch-root DIR]...   run the kvwatch package found in DIR instead; given more than once, one
                               `kvwatch export` per DIR, all at once against the same engine and GPUs
                               (before/after side by side: e.g. DIR = a git worktree of an older commit)
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
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from engine_support import free_port  # noqa: E402
from nvml_standin import GIB, StandinGpu, StandinProcess, StandinState, standin_library  # noqa: E402

METRICS = ROOT / "tests" / "fixtures" / "metrics"
BAR_CPU, BAR_RSS = 0.01, 60 * 2**20


class Engine(http.server.BaseHTTPRequestHandler):
    page = (METRICS / "cpu_block64.txt").read_bytes()

    def do_GET(self) -> None:  # noqa: N802
        body = self.page if self.path == "/metrics" else b""
        self.send_response(200 if self.path in ("/metrics", "/health") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def wait_ready(url: str, needle: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while needle not in get(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args[0]} not serving {needle!r} at {url} (exit {proc.poll()})")
        time.sleep(0.5)


def tree_name(root: str) -> str:
    """A tree's label: its directory's name and the commit checked out there (with + when changed)."""
    def git(*argv: str) -> str:
        done = subprocess.run(["git", "-C", root, *argv], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""
    commit = git("rev-parse", "--short", "HEAD")
    dirty = "+" if commit and git("status", "--porcelain", "--untracked-files=no", "--", "kvwatch") else ""
    return f"{Path(root).resolve().name}@{commit}{dirty}" if commit else Path(root).resolve().name


def series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--nvitop", default="/tmp/nvitop-venv/bin/nvitop-exporter")
    p.add_argument("--kvwatch-root", action="append", default=[],
                   help="run the kvwatch package in this directory; repeat to run several trees side by side")
    args = p.parse_args()
    roots = args.kvwatch_root or [str(ROOT)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    library = standin_library()
    state = tmp / "nvml-state.txt"
    engine_pids = [4_000_000 + g for g in range(8)]
    StandinState(gpus=[StandinGpu(uuid=f"GPU-{g:08d}-0000-4000-8000-000000000000", name="NVIDIA H200",
                                  memory_total_bytes=141 * GIB, memory_used_bytes=100 * GIB,
                                  processes=[StandinProcess(engine_pids[g], 90 * GIB)])
                       for g in range(8)]).write(state)
    model = tmp / "model"
    model.mkdir()
    shutil.copy(METRICS / "cpu_block64.config.json", model / "config.json")
    argv = json.loads((METRICS / "cpu_block64.argv.json").read_text())

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine_url = f"http://127.0.0.1:{server.server_address[1]}"
    env = {**os.environ, "NVML_STANDIN_STATE": str(state)}
    nv_port = free_port()
    procs: dict[str, subprocess.Popen] = {}
    urls: dict[str, str] = {}
    for root in roots:
        name = "kvwatch export" if len(roots) == 1 else f"kvwatch {tree_name(root)}"
        kv_port = free_port()
        kv_cmd = [sys.executable, "-m", "kvwatch.cli", "export", "--engine-url", engine_url, "--name", "bench",
                  "--model", str(model), "--device", "cpu", "--listen", f"127.0.0.1:{kv_port}", "--interval", "1",
                  "--state-dir", str(Path(tempfile.mkdtemp(prefix="kvwatch-bench-state-"))),
                  *[a for pid in engine_pids for a in ("--engine-pid", str(pid))], "--", "vllm", "serve", str(model), *argv]
        procs[name] = subprocess.Popen(kv_cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       env={**env, "PYTHONPATH": root, "KVWATCH_NVML_LIBRARY": str(library)})
        urls[name] = f"http://127.0.0.1:{kv_port}/metrics"
    kvwatches = list(procs)
    nvitop_why = None
    if Path(args.nvitop).exists():
        procs["nvitop-exporter"] = subprocess.Popen(
            [args.nvitop, "--bind-address", "127.0.0.1", "--port", str(nv_port), "--interval", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**env, "LD_LIBRARY_PATH": str(library.parent)})
        urls["nvitop-exporter"] = f"http://127.0.0.1:{nv_port}/metrics"
    else:
        nvitop_why = f"{args.nvitop} not found (install nvitop-exporter into its own venv, see the docstring)"
    try:
        for k in kvwatches:
            wait_ready(urls[k], 'kvwatch_gpu_info{gpu="GPU-00000007', procs[k])
        if "nvitop-exporter" in procs:
            try:
                wait_ready(urls["nvitop-exporter"], 'gpu_utilization', procs["nvitop-exporter"])
            except RuntimeError as exc:
                nvitop_why = str(exc)
                procs.pop("nvitop-exporter").kill()
        time.sleep(5)  # warm-up: imports done, a few ticks and scrapes behind
        ps = {name: psutil.Process(proc.pid) for name, proc in procs.items()}
        cpu0 = {name: sum(p.cpu_times()[:2]) for name, p in ps.items()}
        rss: dict[str, list[int]] = {name: [] for name in procs}
        sizes: dict[str, int] = {}
        start = time.monotonic()
        for tick in range(args.seconds):
            for name in procs:
                sizes[name] = series(get(urls[name]))
                rss[name].append(ps[name].memory_info().rss)
            time.sleep(max(0.0, start + tick + 1 - time.monotonic()))
        wall = time.monotonic() - start
        cpu = {name: (sum(p.cpu_times()[:2]) - cpu0[name]) / wall for name, p in ps.items()}
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; 8 GPUs (NVML stand-in), "
          f"interval 1 s, one scrape each per second, {wall:.0f} s measured")
    width = max(18, *(len(name) + 2 for name in procs))
    print(f"{'process':<{width}}{'CPU % of a core':>16}{'RSS max MB':>12}{'RSS last MB':>12}{'series/scrape':>15}")
    for name in procs:
        print(f"{name:<{width}}{cpu[name] * 100:16.2f}{max(rss[name]) / 2**20:12.1f}{rss[name][-1] / 2**20:12.1f}"
              f"{sizes[name]:15d}")
    for k in kvwatches[1:]:   # side by side: each tree against the first (the 'before')
        print(f"{k} / {kvwatches[0]}: CPU x{cpu[k] / cpu[kvwatches[0]]:.2f}, RSS x{max(rss[k]) / max(rss[kvwatches[0]]):.2f}")
    for k in kvwatches:
        if "nvitop-exporter" in procs:
            n = "nvitop-exporter"
            print(f"{k} / nvitop-exporter: CPU x{cpu[k] / cpu[n]:.2f}, RSS x{max(rss[k]) / max(rss[n]):.2f}")
        ok_cpu, ok_rss = cpu[k] < BAR_CPU, max(rss[k]) < BAR_RSS
        print(f"bar: {k} CPU < {BAR_CPU * 100:.0f} % of a core: {'PASS' if ok_cpu else 'MISS'}; "
              f"RSS < {BAR_RSS >> 20} MB: {'PASS' if ok_rss else 'MISS'}")
    if "nvitop-exporter" not in procs:
        print(f"nvitop-exporter not measured: {nvitop_why}")


if __name__ == "__main__":
    main()
