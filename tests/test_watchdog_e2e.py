"""`kvwatch run` on the real vLLM CPU engine: the Must-show list of issue 4.

Each test runs kvwatch as a real process (`python -m kvwatch.cli run`) with a TOML config
of short timeouts, reads its state file and `kvwatch status`, and asks the engine itself
(/metrics, /v1/models) what it runs with. Engines take ~45 s to start on 2 cores, so the
scenarios that can honestly share an engine run one after another in one kvwatch run.
Every process carrying the engine's marker variable is killed at the end, pass or fail.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from engine_support import (
    cpu_runs_fp8_kv,
    engine_argv,
    engine_env,
    free_port,
    http_get,
    llama_config,
    require_engine,
    write_model,
)
from waiting import eventually

from kvwatch.boundary.engine_http import parse_metrics
from kvwatch.exitcodes import EXIT_GAVE_UP
from kvwatch.watchdog.engine_ranks import computes

pytestmark = pytest.mark.engine

START = float(os.environ.get("KVWATCH_TEST_ENGINE_TIMEOUT", "300"))
HANG_TIMEOUT = 10.0
CONFIG = f"""
[engine]
start_timeout_seconds = {START:.0f}
health_interval_seconds = 1
hang_timeout_seconds = {HANG_TIMEOUT:.0f}
stop_timeout_seconds = 15

[policy]
backoff_initial_seconds = 0.5
backoff_max_seconds = 2
max_restarts = 4
max_corrections = 4

[watch]
interval_seconds = 2
"""


def log(message: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Kvwatch:
    """One `kvwatch run` process and its state file."""

    def __init__(self, tmp: Path, name: str, engine: list[str], *flags: str) -> None:
        require_engine()
        self.name = name
        self.state_dir = tmp / "state"
        self.config = tmp / "kvwatch.toml"
        self.config.write_text(CONFIG)
        self.log_path = tmp / f"{name}.log"
        self.argv = [sys.executable, "-m", "kvwatch.cli", "run", "--config", str(self.config), "--name", name,
                     "--state-dir", str(self.state_dir), "--listen", f"127.0.0.1:{free_port()}", *flags,
                     "--", *engine]
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}            # extra environment (kvwatch's, so the engine's too)

    def start(self) -> Kvwatch:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**engine_env(1), **self.env}, start_new_session=True)
        return self

    def state(self) -> dict[str, Any]:
        try:
            return json.loads((self.state_dir / f"{self.name}.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait(self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = START) -> dict[str, Any]:
        assert self.proc is not None
        proc, last = self.proc, {}

        def reached() -> bool:
            nonlocal last
            last = self.state()
            if last and check(last):
                return True
            if proc.poll() is not None:
                raise AssertionError(f"kvwatch exited {proc.returncode} waiting for {what}; "
                                     f"state {last.get('state')}: {last.get('reason')}\n{self.tail()}")
            return False
        if eventually(reached, timeout, interval=0.25):
            return last
        raise AssertionError(f"no {what} after {timeout:.0f}s; state {self.state().get('state')}\n{self.tail()}")

    def wait_ready(self) -> dict[str, Any]:
        return self.wait("ready", lambda d: d["state"] == "ready" and d.get("kvwatch_pid") == self.proc.pid
                         and len(d["pids"]) >= 3)

    def exit_code(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if not line.startswith(f"[{self.name}] "))[-6000:] + \
            "\n--- engine ---\n" + "\n".join(line for line in lines if line.startswith(f"[{self.name}] "))[-3000:]

    def kvwatch_lines(self) -> list[str]:
        return [line for line in self.log_path.read_text(errors="replace").splitlines()
                if " kvwatch " in line and not line.startswith(f"[{self.name}] ")]

    def status(self) -> str:
        out = subprocess.run([sys.executable, "-m", "kvwatch.cli", "status", "--state-dir", str(self.state_dir),
                              "--name", self.name], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def marker(self) -> str:
        return f"{self.name}@{os.path.abspath(self.state_dir)}"

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in engine_processes(self.marker()):
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass


def engine_processes(marker: str) -> list[int]:
    """Live processes started by kvwatch for this engine (they carry its marker variable)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("KVWATCH_ENGINE") == marker:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: list[int], timeout: float) -> float:
    started = time.monotonic()
    if not eventually(lambda: not alive(pids), timeout, interval=0.1):
        raise AssertionError(f"still running after {timeout}s: {alive(pids)}")
    return time.monotonic() - started


def engine_url(state: dict[str, Any]) -> str:
    argv = state["argv"]
    return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"


def cache_config(state: dict[str, Any]) -> Any:
    status, body = http_get(engine_url(state) + "/metrics")
    assert status == 200
    metrics = parse_metrics(body)
    assert metrics.ok and metrics.cache is not None, metrics.error
    return metrics.cache


def served_max_model_len(state: dict[str, Any]) -> int:
    status, body = http_get(engine_url(state) + "/v1/models")
    assert status == 200
    return int(json.loads(body)["data"][0]["max_model_len"])


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.fixture
def wide(tmp_path: Path) -> Path:
    """docs/vllm-facts.md §9: 4 layers, 8 KV heads, head 64, bf16, 262144 positions; 1 GiB holds 130,944 tokens."""
    return write_model(tmp_path / "wide", llama_config(layers=4, kv_heads=8, heads=8, head_dim=64, max_len=262144))


def test_block_size_corrected_then_crash_hang_kill9_and_restart(tmp_path: Path, tiny: Path) -> None:
    """--no-preflight --block-size 8: one correction to 32, served; then on the same run: kill -9 of
    EngineCore, SIGSTOP of the engine, kill -9 of kvwatch; then a new kvwatch starts clean and
    launches the corrected plan first, with zero failures."""
    port = free_port()
    engine = engine_argv(tiny, port, "--block-size", "8")
    kv = Kvwatch(tmp_path, "bs8", engine, "--no-preflight")
    try:
        t0 = time.monotonic()
        kv.start()
        ready = kv.wait_ready()
        log(f"block size 8 -> ready after {time.monotonic() - t0:.0f}s")
        assert [c["kind"] for c in ready["corrections"]] == ["block_size_unsupported"]
        assert [f["kind"] for f in ready["failures"]] == ["block_size_unsupported"]
        assert flag(ready["argv"], "--block-size") == "32"
        assert cache_config(ready).block_size == 32
        assert ready["plans_tried"] == [engine, ready["argv"]]
        status = kv.status()
        assert "block_size_unsupported: --block-size 32" in status and "ready" in status

        # kill -9 of EngineCore while serving: restarted with the same plan, nothing of the old tree left.
        old = [p["pid"] for p in ready["pids"]]
        core = next(p["pid"] for p in ready["pids"] if "EngineCore" in p["name"])
        t1 = time.monotonic()
        os.kill(core, signal.SIGKILL)
        kv.wait("the crash", lambda d: d["restarts"].get("engine_died") == 1)
        detected = time.monotonic() - t1
        again = kv.wait_ready()
        log(f"kill -9 EngineCore: detected after {detected:.1f}s, serving again after {time.monotonic() - t1:.0f}s")
        assert again["argv"] == ready["argv"] and len(again["corrections"]) == 1
        assert alive(old) == [] and not set(old) & {p["pid"] for p in again["pids"]}
        assert cache_config(again).block_size == 32

        # SIGSTOP of the whole engine: a hang, detected within the window, killed, restarted.
        old = [p["pid"] for p in again["pids"]]
        t2 = time.monotonic()
        os.killpg(os.getpgid(old[0]), signal.SIGSTOP)
        hung = kv.wait("the hang", lambda d: d["restarts"].get("engine_died") == 2, timeout=HANG_TIMEOUT + 30)
        detected = time.monotonic() - t2
        assert "hang_timeout" in hung["failures"][-1]["evidence"]
        assert wait_gone(old, 20) < 20
        third = kv.wait_ready()
        log(f"SIGSTOP: hang detected after {detected:.1f}s, serving again after {time.monotonic() - t2:.0f}s")
        assert third["argv"] == ready["argv"]

        # kill -9 of kvwatch: the reaper ends the engine group within seconds.
        tree = [p["pid"] for p in third["pids"]]
        assert kv.proc is not None
        kv.proc.kill()
        kv.proc.wait()
        gone = wait_gone(tree, 15)
        log(f"kill -9 kvwatch: engine tree ({len(tree)} processes) gone after {gone:.1f}s")
        assert gone < 10 and engine_processes(kv.marker()) == []

        # The next run starts clean and launches the corrected plan first: zero failures.
        failures_before = len(third["failures"])
        t3 = time.monotonic()
        kv.start()
        fourth = kv.wait_ready()
        log(f"restart of kvwatch: corrected plan serving after {time.monotonic() - t3:.0f}s")
        assert fourth["plans_tried"][-1] == ready["argv"] and fourth["argv"] == ready["argv"]
        assert len(fourth["failures"]) == failures_before and fourth["failure_counts"] == {}
        assert fourth["foreign"] == []
        assert not any("leftovers:" in line for line in kv.kvwatch_lines())
        assert cache_config(fourth).block_size == 32

        # SIGTERM: the engine group goes, kvwatch exits 0.
        tree = [p["pid"] for p in fourth["pids"]]
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
        assert alive(tree) == [] and kv.state()["state"] == "stopped"
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


@pytest.fixture
def tiny16(tmp_path: Path) -> Path:
    """Head size 16: vLLM's CPU backend refuses an fp8 KV cache for it on every CPU (checked before the ISA)."""
    return write_model(tmp_path / "tiny16", llama_config(head_dim=16))


def test_preflight_fixes_block_size_fp8_and_max_model_len_with_no_failed_launch(tmp_path: Path, wide: Path) -> None:
    """Block 8, fp8 and max-model-len 262144 on `wide`. Where the CPU runs fp8 KV (AVX-512 or AMX), fp8 is
    legal and halves the bytes per token, so only the block size and the max model len are fixed."""
    require_engine()
    fp8_runs = cpu_runs_fp8_kv()
    engine = engine_argv(wide, free_port(), "--block-size", "8", "--kv-cache-dtype", "fp8", "--max-model-len", "262144")
    kv = Kvwatch(tmp_path, "pre", engine)
    try:
        t0 = time.monotonic()
        ready = kv.start().wait_ready()
        log(f"preflight (block 8, fp8, max-model-len 262144): ready after {time.monotonic() - t0:.0f}s, one launch")
        assert ready["failures"] == [] and ready["corrections"] == [] and len(ready["plans_tried"]) == 1
        kinds = {"block_size_unsupported", "kv_cache_too_small"} | (set() if fp8_runs else {"kv_dtype_unsupported"})
        assert {f["kind"] for f in ready["preflight"]} == kinds
        argv = ready["argv"]
        kv_dtype = "fp8" if fp8_runs else "auto"
        assert flag(argv, "--block-size") == "32" and flag(argv, "--kv-cache-dtype") == kv_dtype
        cache = cache_config(ready)
        assert cache.block_size == 32 and cache.cache_dtype == kv_dtype
        fits = 262144 if fp8_runs else 131072   # 1 GiB at 4,096 (fp8) or 8,192 (bf16) bytes per token
        assert served_max_model_len(ready) == int(flag(argv, "--max-model-len") or 0) <= fits
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


def test_fp8_kv_falls_back_to_auto_at_run_time(tmp_path: Path, tiny16: Path) -> None:
    """--no-preflight --kv-cache-dtype fp8 with head size 16: the real engine rejects it on every CPU;
    one correction to auto, from vLLM's own message, and the engine serves with an auto KV cache."""
    engine = engine_argv(tiny16, free_port(), "--kv-cache-dtype", "fp8")
    kv = Kvwatch(tmp_path, "fp8", engine, "--no-preflight")
    try:
        t0 = time.monotonic()
        ready = kv.start().wait_ready()
        log(f"fp8 at run time: ready after {time.monotonic() - t0:.0f}s")
        assert [c["kind"] for c in ready["corrections"]] == ["kv_dtype_unsupported"]
        assert ready["corrections"][0]["set"] == {"--kv-cache-dtype": "auto"}
        assert "FP8 KV cache" in ready["failures"][0]["evidence"]
        assert flag(ready["argv"], "--kv-cache-dtype") == "auto"
        assert cache_config(ready).cache_dtype == "auto"
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


def test_max_model_len_beyond_kv_space_corrected_at_run_time(tmp_path: Path, wide: Path) -> None:
    """--no-preflight --max-model-len 262144 with 1 GiB of KV: vLLM says 130,944 fit; kvwatch sets
    exactly that and the engine serves it."""
    engine = engine_argv(wide, free_port(), "--max-model-len", "262144")
    kv = Kvwatch(tmp_path, "mml", engine, "--no-preflight")
    try:
        t0 = time.monotonic()
        ready = kv.start().wait_ready()
        log(f"max-model-len at run time: ready after {time.monotonic() - t0:.0f}s")
        assert [c["kind"] for c in ready["corrections"]] == ["kv_cache_too_small"]
        assert "estimated maximum model length is 130944" in ready["failures"][0]["evidence"]
        assert served_max_model_len(ready) == int(flag(ready["argv"], "--max-model-len") or 0) == 130944
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


def test_unfixable_model_config_is_fatal_with_exit_78(tmp_path: Path) -> None:
    config = llama_config()
    config["architectures"] = ["NoSuchModelForCausalLM"]
    model = write_model(tmp_path / "bad", config)
    kv = Kvwatch(tmp_path, "bad", engine_argv(model, free_port()))
    try:
        t0 = time.monotonic()
        kv.start()
        assert kv.exit_code(timeout=START) == EXIT_GAVE_UP
        log(f"unfixable config: FATAL after {time.monotonic() - t0:.0f}s")
        data = kv.state()
        assert data["state"] == "fatal" and data["reason"].startswith("gave up: ")
        assert 1 <= len(data["failures"]) <= 1 + 4  # bounded: max_restarts
        assert data["pids"] == []
        status = kv.status()
        assert "fatal" in status and "gave up" in status and "kvwatch not running" in status
        assert "ValidationError" in status or "NoSuchModelForCausalLM" in status
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


# -- vLLM's refusals of its own configuration (issue 17) -------------------------------------------

@pytest.fixture
def short(tmp_path: Path) -> Path:
    """max_position_embeddings 1024: vLLM refuses any --max-model-len above it."""
    return write_model(tmp_path / "short", llama_config(max_len=1024))


def test_max_model_len_above_the_model_is_lowered_by_preflight(tmp_path: Path, short: Path) -> None:
    kv = Kvwatch(tmp_path, "mmlpre", engine_argv(short, free_port(), "--max-model-len", "300000"))
    try:
        t0 = time.monotonic()
        ready = kv.start().wait_ready()
        log(f"max-model-len 300000 > 1024, preflight: ready after {time.monotonic() - t0:.0f}s")
        assert ready["failures"] == [] and ready["corrections"] == [] and len(ready["plans_tried"]) == 1
        assert [(f["kind"], f["set"]) for f in ready["preflight"]] == [("config_refused", {"--max-model-len": 1024})]
        assert flag(ready["argv"], "--max-model-len") == "1024" and served_max_model_len(ready) == 1024
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


def test_max_model_len_above_the_model_corrected_after_one_failed_launch(tmp_path: Path, short: Path) -> None:
    kv = Kvwatch(tmp_path, "mmlrun", engine_argv(short, free_port(), "--max-model-len", "300000"), "--no-preflight")
    try:
        t0 = time.monotonic()
        ready = kv.start().wait_ready()
        log(f"max-model-len 300000 > 1024 at run time: ready after {time.monotonic() - t0:.0f}s")
        [failure] = ready["failures"]
        assert failure["kind"] == "config_refused"
        assert failure["evidence"].startswith("User-specified max_model_len (300000) is greater than the derived "
                                              "max_model_len (max_position_embeddings=1024.0")
        assert [(c["kind"], c["set"]) for c in ready["corrections"]] == [("config_refused", {"--max-model-len": 1024})]
        assert served_max_model_len(ready) == 1024
        assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in " ".join(ready["argv"])
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


def test_unfixable_refusal_is_fatal_after_one_launch_with_vllms_sentence(tmp_path: Path, tiny: Path) -> None:
    """-tp 3 with 4 attention heads: kvwatch changes no GPU count, so FATAL at once, exit 78."""
    kv = Kvwatch(tmp_path, "tp3", engine_argv(tiny, free_port(), "--tensor-parallel-size", "3"))
    sentence = "Total number of attention heads (4) must be divisible by tensor parallel size (3)."
    try:
        t0 = time.monotonic()
        kv.start()
        assert kv.exit_code(timeout=START) == EXIT_GAVE_UP
        log(f"-tp 3: FATAL after {time.monotonic() - t0:.0f}s")
        data = kv.state()
        assert data["state"] == "fatal" and data["reason"] == f"gave up: config_refused: {sentence} (no remedy)"
        assert [(f["kind"], f["evidence"]) for f in data["failures"]] == [("config_refused", sentence)]
        assert any(f"gave up: config_refused: {sentence}" in line for line in kv.kvwatch_lines())
        status = kv.status()
        assert sentence in status and "ValidationError" not in status
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


# -- data-parallel ranks (issue 18) -----------------------------------------------------------------

def kvwatch_metrics(kv: Kvwatch) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families
    port = kv.argv[kv.argv.index("--listen") + 1].rsplit(":", 1)[1]
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def metrics_with(kv: Kvwatch, *series: tuple[str, frozenset], timeout: float = 60) -> dict[tuple[str, frozenset], float]:
    """kvwatch's /metrics once it holds every one of `series` (the exporter's next tick after READY);
    the last page read when it never did (the caller's assertions then say what is missing)."""
    last: dict[tuple[str, frozenset], float] = {}

    def has_them() -> bool:
        nonlocal last
        last = kvwatch_metrics(kv)
        return all(s in last for s in series)
    eventually(has_them, timeout, interval=0.5)
    return last


def test_data_parallel_ranks_planned_equals_actual_and_one_rank_death(tmp_path: Path, tiny: Path) -> None:
    """--data-parallel-size 2: two engine cores of 1 GiB each. Per rank: planned == actual, drift 0, usage;
    then kill -9 of rank 1's core: diagnosed as rank 1's death, restarted, serving again."""
    kv = Kvwatch(tmp_path, "dp", engine_argv(tiny, free_port(), "--data-parallel-size", "2"))
    try:
        t0 = time.monotonic()
        ready = kv.start().wait_ready()
        log(f"DP 2: ready after {time.monotonic() - t0:.0f}s")
        found = metrics_with(kv, *(("kvwatch_kv_actual_blocks", frozenset({("engine", "dp"), ("rank", r)}))
                                   for r in "01"))
        for rank in ("0", "1"):
            key = frozenset({("engine", "dp"), ("rank", rank)})
            assert found[("kvwatch_kv_planned_blocks", key)] == found[("kvwatch_kv_actual_blocks", key)] == 16_384
            assert found[("kvwatch_kv_plan_drift_ratio", key)] == 0
            assert ("kvwatch_kv_usage_ratio", key) in found

        core = next(p for p in psutil.process_iter(["pid", "cmdline"])
                    if p.info["cmdline"] and "EngineCore_DP1" in " ".join(p.info["cmdline"])
                    and p.pid in [q["pid"] for q in ready["pids"]])
        core.kill()
        again = kv.wait("serving again after rank 1's death",
                        lambda d: d["state"] == "ready" and len(d["failures"]) == 1 and len(d["pids"]) >= 3)
        [failure] = again["failures"]
        log(f"DP 2: rank 1 killed, serving again after {time.monotonic() - t0:.0f}s: {failure['evidence'][:120]}")
        assert failure["kind"] == "engine_died"
        assert failure["evidence"].startswith("the engine core of data-parallel rank 1 (EngineCore_DP1")
        assert again["corrections"] == [] and again["argv"] == ready["argv"]
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


# -- hostile input: a request cannot steer the watchdog (issue 15) -----------------------------------

def test_a_request_that_quotes_a_failure_does_not_steer_the_watchdog(tmp_path: Path, tiny: Path) -> None:
    """--enable-log-requests at DEBUG: vLLM logs the request body, here with vLLM's block-size sentence
    in it. Then the engine core dies: kvwatch restarts the same plan, learns nothing, corrects nothing."""
    payload = "No common block size for 128 (CPU_ATTN: [MultipleOf(4096)])"
    port = free_port()
    kv = Kvwatch(tmp_path, "steer", engine_argv(tiny, port, "--enable-log-requests"))
    kv.env = {"VLLM_LOGGING_LEVEL": "DEBUG"}
    try:
        ready = kv.start().wait_ready()
        body = json.dumps({"model": str(tiny), "prompt": [1, 2, 3], "max_tokens": 2, "user": payload}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.status == 200
        eventually(lambda: payload in kv.log_path.read_text(errors="replace"), 10, interval=0.2)
        assert payload in kv.log_path.read_text(errors="replace"), "the engine did not log the request"
        core = next(p for p in psutil.process_iter(["pid", "cmdline"])
                    if p.info["cmdline"] and "EngineCore" in " ".join(p.info["cmdline"])
                    and p.pid in [q["pid"] for q in ready["pids"]])
        core.kill()
        again = kv.wait("serving again", lambda d: d["state"] == "ready" and len(d["failures"]) == 1
                        and len(d["pids"]) >= 3)
        assert again["failures"][0]["kind"] == "engine_died"
        assert again["corrections"] == [] and again["constraints"] == [] and again["argv"] == ready["argv"]
        assert "MultipleOf(4096)" not in json.dumps(again)
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


# -- a hybrid model under kvwatch run (issue 11) ------------------------------------------------------

def test_hybrid_gemma3_planned_equals_actual_with_padding_by_cause(tmp_path: Path) -> None:
    """The shrunk Gemma 3 1B (5 sliding : 1 full, no layer_types in config.json) under kvwatch run:
    six KV cache groups; planned blocks == the engine's, drift 0, and the plan's tokens equal the
    tokens the engine logs (a sliding layer holds only its window per request)."""
    from fixtures.models import corpus
    model = write_model(tmp_path / "gemma3", corpus.CORPUS["gemma3_text"]["config"])
    kv = Kvwatch(tmp_path, "gemma3", engine_argv(model, free_port(), "--max-model-len", "2048"))
    try:
        ready = kv.start().wait_ready()
        key = frozenset({("engine", "gemma3"), ("rank", "0")})
        found = metrics_with(kv, ("kvwatch_kv_actual_blocks", key))
        planned = found[("kvwatch_kv_planned_blocks", key)]
        log(f"gemma3: planned {planned:.0f} blocks, actual {found[('kvwatch_kv_actual_blocks', key)]:.0f}")
        assert planned == found[("kvwatch_kv_actual_blocks", key)] > 0
        assert found[("kvwatch_kv_plan_drift_ratio", key)] == 0
        padding = {dict(labels)["cause"]: v for (name, labels), v in found.items()
                   if name == "kvwatch_kv_padding_bytes" and ("engine", "gemma3") in labels}
        assert {"layer_padding", "state_padding", "null_block", "remainder"} <= set(padding)
        plan = json.loads(subprocess.run(
            [sys.executable, "-m", "kvwatch.cli", "plan", "--device", "cpu", "--json", "--", *ready["argv"]],
            capture_output=True, text=True, env=engine_env(1), timeout=60, check=True).stdout)
        assert plan["kv_cache_groups"] == 6 and plan["num_blocks"] == planned
        logged = kv.wait("the KV size line parsed", lambda d: d.get("log_kv_tokens") is not None)
        assert plan["kv_cache_tokens"] == logged["log_kv_tokens"]
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()


# -- Gemma 4 under kvwatch run (issue 26) -------------------------------------------------------------

def test_gemma4_kv_sharing_and_wide_full_layers_planned_equals_actual(tmp_path: Path) -> None:
    """The shrunk Gemma 4 E2B (4 sliding : 1 full, the last 4 of 10 layers reading an earlier layer's
    cache, full-attention heads twice as wide) under kvwatch run: 6 cache layers in 6 groups, the
    sliding groups at twice the block size so the pages match; planned blocks == the engine's, drift 0,
    and the plan's tokens equal the tokens the engine logs."""
    from fixtures.models import corpus
    model = write_model(tmp_path / "gemma4", corpus.CORPUS["gemma4_e2b"]["config"])
    kv = Kvwatch(tmp_path, "gemma4", engine_argv(model, free_port(), "--max-model-len", "2048"))
    try:
        ready = kv.start().wait_ready()
        key = frozenset({("engine", "gemma4"), ("rank", "0")})
        found = metrics_with(kv, ("kvwatch_kv_actual_blocks", key))
        planned = found[("kvwatch_kv_planned_blocks", key)]
        log(f"gemma4: planned {planned:.0f} blocks, actual {found[('kvwatch_kv_actual_blocks', key)]:.0f}")
        assert planned == found[("kvwatch_kv_actual_blocks", key)] > 0
        assert found[("kvwatch_kv_plan_drift_ratio", key)] == 0
        plan = json.loads(subprocess.run(
            [sys.executable, "-m", "kvwatch.cli", "plan", "--device", "cpu", "--json", "--", *ready["argv"]],
            capture_output=True, text=True, env=engine_env(1), timeout=60, check=True).stdout)
        assert plan["kv_cache_groups"] == 6 and plan["num_blocks"] == planned
        logged = kv.wait("the KV size line parsed", lambda d: d.get("log_kv_tokens") is not None)
        assert plan["kv_cache_tokens"] == logged["log_kv_tokens"]
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()


# -- while it serves: a stall (issue 28) ---------------------------------------------------------------

STALL_TIMEOUT = 8.0


def _generate(url: str, model: Path, tokens: int) -> None:
    body = json.dumps({"model": str(model), "prompt": [1, 2, 3, 4] * 50, "max_tokens": tokens,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            resp.read()
    except OSError:
        pass   # the stalled engine's request is cut when kvwatch ends it


def test_a_stopped_worker_while_a_request_runs_is_a_stall_the_idle_and_the_busy_are_not(
        tmp_path: Path, tiny: Path) -> None:
    """SIGSTOP on the engine core and worker while a request runs, the way a wedged kernel looks from
    outside: /health keeps answering 200, no token comes. kvwatch ends the launch as `stalled` within
    stall_timeout plus one health interval (and the load of this box), and the same plan serves
    again. Before that, an idle engine and a stream of long generations are never flagged."""
    import threading
    port = free_port()
    kv = Kvwatch(tmp_path, "stall", engine_argv(tiny, port))
    kv.config.write_text(CONFIG.replace("[engine]\n", f"[engine]\nstall_timeout_seconds = {STALL_TIMEOUT:.0f}\n"))
    url = f"http://127.0.0.1:{port}"
    try:
        ready = kv.start().wait_ready()
        time.sleep(STALL_TIMEOUT + 4)                                       # idle: nothing runs
        busy_until = time.monotonic() + STALL_TIMEOUT + 4                   # long generations, back to back
        while time.monotonic() < busy_until:
            _generate(url, tiny, 1500)
        assert kv.state()["failures"] == [] and kv.state()["state"] == "ready"
        def running() -> bool:
            """The engine's page shows a request running. Its stats reach the API server with the
            engine's steps, so once the engine is stopped the page keeps the count of its last step."""
            try:
                status, page = http_get(f"{url}/metrics", timeout=10)
            except OSError:
                return False
            return status == 200 and (parse_metrics(page).load.running or 0) >= 1

        # Stop the engine's cores and workers (by their vLLM titles, cut or not) while a long request
        # runs. The scenario needs the request still running at the stop: on a fast box a request can
        # end between the look and the stop, or the stop can come before its first step (0 running,
        # an idle engine). Then the engine is let go and the request sent again.
        for _attempt in range(3):
            request = threading.Thread(target=_generate, args=(url, tiny, 3500), daemon=True)
            request.start()
            if not eventually(running, 20, interval=0.1):
                request.join(120)
                continue
            cores = [p for p in psutil.Process(ready["pids"][0]["pid"]).children(recursive=True)
                     if computes(p.name()) or computes(" ".join(p.cmdline()[:1]))]
            assert cores, "no engine core or worker found"
            stopped_at = time.monotonic()
            for p in cores:
                p.send_signal(signal.SIGSTOP)
            if running():
                break
            for p in cores:
                p.send_signal(signal.SIGCONT)
            request.join(120)
        else:
            raise AssertionError("never caught the long request running at the engine's stop")
        assert http_get(f"{url}/health")[0] == 200                          # the engine looks alive
        ready_url = f"http://{kv.argv[kv.argv.index('--listen') + 1]}/-/ready"
        assert http_get(ready_url)[0] == 200
        eventually(lambda: http_get(ready_url)[0] != 200, 60 - (time.monotonic() - stopped_at), interval=0.1)
        took = time.monotonic() - stopped_at
        log(f"readiness 503 after {took:.1f}s (stall timeout {STALL_TIMEOUT:.0f}s + 1 s interval)")
        assert took <= STALL_TIMEOUT + 1 + 4, took                          # + the probe's scrape on a loaded box
        stalled = kv.wait("the stall", lambda d: any(f["kind"] == "stalled" for f in d["failures"]), timeout=60)
        assert "requests running and no token" in stalled["failures"][0]["evidence"]
        again = kv.wait("serving again", lambda d: d["state"] == "ready" and len(d["pids"]) >= 3
                        and d["restarts"].get("stalled") == 1)
        assert again["argv"] == ready["argv"] and again["corrections"] == []
        _generate(url, tiny, 8)
        kv.proc.send_signal(signal.SIGTERM)
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []
