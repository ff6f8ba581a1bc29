"""Time to a serving engine after a known-bad command (issue 7, item 7): the real vLLM CPU
engine with `--block-size 8` (the CPU backend takes multiples of 32 only), three ways:
  (a) `kvwatch run` (default config: preflight on): the plan sees the block size first;
  (b) `kvwatch run --no-preflight`: the engine fails, kvwatch reads its log and corrects it;
  (c) a plain restart loop with the same command (1 s between launches, as systemd's
      Restart=always with RestartSec=1 would), bounded to LOOP_LAUNCHES launches: it never serves.
Serving = the engine's own /health answers 200 (polled every 0.5 s by this script);
launches = the "spawned:" lines kvwatch logged (the loop counts its own).
Every process tree started here is stopped at the end (kvwatch stops its engine on SIGTERM;
whatever still carries the run's marker is killed).

Run: .venv/bin/python bench/bench_time_to_serve.py [--loop-launches 3]   (~5 minutes on 2 cores)
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from engine_support import (  # noqa: E402
    engine_argv,
    engine_env,
    free_port,
    http_get,
    kill_tree,
    llama_config,
    require_engine,
    write_model,
)

TIMEOUT = 300.0


def wait_serving(url: str, proc: subprocess.Popen, start: float) -> float | None:
    while time.monotonic() - start < TIMEOUT:
        if http_get(url + "/health", timeout=2)[0] == 200:
            return time.monotonic() - start
        if proc.poll() is not None:
            return None
        time.sleep(0.5)
    return None


def marked(state_dir: Path) -> list[psutil.Process]:
    """Processes carrying this run's marker (kvwatch's KVWATCH_ENGINE variable)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if str(state_dir) in proc.environ().get("KVWATCH_ENGINE", ""):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kvwatch(tmp: Path, model: Path, *flags: str) -> tuple[float | None, int]:
    port = free_port()
    state = tmp / f"state{len(flags)}"
    log_path = tmp / f"kvwatch{len(flags)}.log"
    argv = [sys.executable, "-m", "kvwatch.cli", "run", "--name", "bench", "--state-dir", str(state),
            "--listen", f"127.0.0.1:{free_port()}", *flags, "--", *engine_argv(model, port, "--block-size", "8")]
    start = time.monotonic()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=engine_env(1), start_new_session=True)
    try:
        took = wait_serving(f"http://127.0.0.1:{port}", proc, start)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
        for left in marked(state):
            left.kill()
    launches = log_path.read_text(errors="replace").count("spawned:")
    return took, launches


def restart_loop(model: Path, launches: int) -> tuple[float, int]:
    port = free_port()
    argv = engine_argv(model, port, "--block-size", "8")
    start = time.monotonic()
    for n in range(1, launches + 1):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=engine_env(1), start_new_session=True)
        try:
            if wait_serving(f"http://127.0.0.1:{port}", proc, time.monotonic()) is not None:
                raise AssertionError("the block-size-8 engine served: the bench's premise is wrong")
        finally:
            kill_tree(proc)
        if n < launches:
            time.sleep(1.0)
    return time.monotonic() - start, launches


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--loop-launches", type=int, default=3)
    args = p.parse_args()
    require_engine()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; real vLLM CPU engine, "
          f"--block-size 8", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        model = write_model(tmp / "tiny", llama_config())
        for label, flags in (("kvwatch run (preflight)", ()), ("kvwatch run --no-preflight", ("--no-preflight",))):
            took, launches = kvwatch(tmp, model, *flags)
            rows.append((label, took, launches))
            print(f"  {label:<34} serving after {took if took is not None else float('nan'):6.1f} s, "
                  f"{launches} launch(es)", flush=True)
        loop_s, loop_n = restart_loop(model, args.loop_launches)
        rows.append(("plain restart loop (bounded)", None, loop_n))
        print(f"  {'plain restart loop (bounded)':<34} not serving after {loop_s:6.1f} s, {loop_n} launches "
              f"({loop_s / loop_n:.1f} s each)", flush=True)
    (_, pre, pre_n), (_, nopre, nopre_n), _ = rows
    if pre is not None and nopre is not None:
        print(f"kvwatch preflight / no-preflight: time x{pre / nopre:.2f}, launches {pre_n} vs {nopre_n}; "
              f"plain loop: never serves ({loop_n} launches, {loop_s:.0f} s spent, "
              f"x{loop_s / pre:.2f} kvwatch's time to serve, and counting)")


if __name__ == "__main__":
    main()
