"""Signals to `kvwatch run` and `kvwatch export` as real processes (README "Signals"): SIGHUP is
ignored with a line, not an end that leaves a state file saying `ready` or a claim behind; a
storm of SIGTERMs never cuts the first one's clean stop short (exit 0, never -15)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from engine_support import free_port
from waiting import eventually

FAKE = str(Path(__file__).resolve().parent / "fake_engine.py")


def _state(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _storm(proc: subprocess.Popen, signum: int, seconds: float) -> int | None:
    """Send `signum` every few milliseconds for `seconds` or until `proc` exits; its exit code."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            break
        time.sleep(0.003)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        return None


def test_run_ignores_sighup_and_a_sigterm_storm_still_ends_it_cleanly(tmp_path: Path, tiny: Path) -> None:
    state = tmp_path / "state"
    log_path = tmp_path / "kvwatch.log"
    cmd = [sys.executable, "-m", "kvwatch.cli", "run", "--name", "sig", "--state-dir", str(state),
           "--listen", f"127.0.0.1:{free_port()}", "--no-preflight", "--",
           sys.executable, FAKE, "--model", str(tiny), "--port", str(free_port())]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = eventually(lambda: _state(state / "sig.json").get("state") == "ready", 30)
        assert ready, log_path.read_text()
        pids = [p["pid"] for p in _state(state / "sig.json")["pids"]]
        for _ in range(3):
            proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None, log_path.read_text()[-3000:]   # SIGHUP did not end it
        assert _state(state / "sig.json")["state"] == "ready"
        assert "SIGHUP ignored" in log_path.read_text()
        code = _storm(proc, signal.SIGTERM, 10.0)
        assert code == 0, log_path.read_text()[-3000:]
        assert _state(state / "sig.json")["state"] == "stopped"
        assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert "already stopping" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_export_ignores_sighup_and_withdraws_its_claim_at_a_sigterm_storm(tmp_path: Path) -> None:
    state = tmp_path / "state"
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    cmd = [sys.executable, "-m", "kvwatch.cli", "export", "--name", "ext", "--state-dir", str(state),
           "--engine-url", f"http://127.0.0.1:{free_port()}", "--engine-pid", str(engine.pid), "--no-nvml",
           "--interval", "0.2", "--listen", f"127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    claim = state / "engines" / "ext.json"
    try:
        assert eventually(claim.exists, 20)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None and claim.exists()             # SIGHUP did not end it
        assert _storm(proc, signal.SIGTERM, 10.0) == 0
        assert not claim.exists()
        assert proc.stdout is not None and b"SIGHUP ignored" in proc.stdout.read()
    finally:
        for p in (proc, engine):
            if p.poll() is None:
                p.kill()
                p.wait()
