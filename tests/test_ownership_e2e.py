"""The next kvwatch after a kill -9 of kvwatch and its reaper: what the killed one left is proven
the engine's from the state file's spawn records (kvwatch/watchdog/ownership.py) and ended; what
only looks like it is reported and left alone. kvwatch runs as a real process (`kvwatch run`,
the child subreaper of its engine), once with the stand-in engine, once with the real CPU engine.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from engine_support import engine_argv, engine_env, free_port, http_get, llama_config, require_engine, write_model
from waiting import eventually

from kvwatch.boundary import spawn
from kvwatch.boundary.proc_inspect import ProcRef
from kvwatch.watchdog import leftovers
from kvwatch.watchdog.ownership import EngineProof, Verdict

FAKE = str(Path(__file__).resolve().parent / "fake_engine.py")
CONFIG = """
[engine]
start_timeout_seconds = {start}
health_interval_seconds = 0.5
stop_timeout_seconds = 3

[policy]
backoff_initial_seconds = 0.5
max_restarts = 2
"""


class Run:
    """One `kvwatch run` process on a state dir."""

    def __init__(self, tmp: Path, engine: list[str], start_timeout: float = 30, env: dict[str, str] | None = None):
        self.state_dir = tmp / "state"
        self.log_path = tmp / "kvwatch.log"
        config = tmp / "kvwatch.toml"
        config.write_text(CONFIG.format(start=int(start_timeout)))
        self.port = free_port()
        self.argv = [sys.executable, "-m", "kvwatch.cli", "run", "--config", str(config), "--name", "own",
                     "--state-dir", str(self.state_dir), "--listen", f"127.0.0.1:{self.port}", "--no-preflight",
                     "--", *engine]
        self.env = env or dict(os.environ)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Run:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        return self

    def state(self) -> dict[str, Any]:
        try:
            return json.loads((self.state_dir / "own.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait(self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        assert self.proc is not None
        proc = self.proc

        def ready() -> dict[str, Any] | None:
            data = self.state()
            if data and data.get("kvwatch_pid") == proc.pid and check(data):
                return data
            assert proc.poll() is None, f"kvwatch exited {proc.returncode} waiting for {what}\n{self.log()}"
            return None

        found = eventually(ready, timeout, interval=0.2)
        if found:
            return found
        raise AssertionError(f"no {what} after {timeout:.0f}s: {self.state().get('reason')}\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def reaper(self) -> int:
        assert self.proc is not None
        (reaper,) = [c.pid for c in psutil.Process(self.proc.pid).children()
                     if "kvwatch.watchdog.reaper" in " ".join(c.cmdline())]
        return reaper

    def kill_with_reaper(self) -> None:
        """kill -9 of kvwatch and its reaper at once: nothing of kvwatch is left to end the engine."""
        assert self.proc is not None
        reaper = self.reaper()
        os.kill(reaper, signal.SIGKILL)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        assert eventually(lambda: not psutil.pid_exists(reaper) or psutil.Process(reaper).status() == "zombie", 5)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def running(pid: int, create_time: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - create_time) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def session_of(sid: int) -> list[ProcRef]:
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(ProcRef(proc.pid, proc.create_time()))
        except (OSError, psutil.Error):
            continue
    return out


def lookalike(pid_file: Path) -> None:
    """Someone's orphan that calls itself vLLM's EngineCore (same user, started after the engine):
    nothing proves it the engine's. Its parent exits at once: it goes to init."""
    code = ("import os, sys, time\n"
            "if os.fork(): sys.exit(0)\n"
            "os.setsid()\n"
            "with open('/proc/self/comm', 'w') as f: f.write('VLLM::EngineCore')\n"
            f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "time.sleep(120)\n")
    subprocess.run(["VLLM::EngineCore", "-c", code], executable=sys.executable, env={}, check=True, timeout=30)


def test_the_next_kvwatch_ends_what_a_killed_kvwatch_and_reaper_left(tmp_path: Path) -> None:
    """The stand-in engine with an EngineCore in its group, a double-forked daemon in its session and
    one that called setsid (both with an empty environment and vLLM's kind of title). kill -9 of
    kvwatch and its reaper leaves all three. The next kvwatch proves each one the engine's from the
    state file, ends it before its own launch and says so; an orphan that only calls itself
    EngineCore is reported (log, state file, kvwatch_engine_escaped_processes) and left alone."""
    assert spawn.become_subreaper(False)   # the lookalike below must go to init, not to this process
    model = write_model(tmp_path / "tiny", llama_config())
    daemon_file, escape_file, other_file = tmp_path / "daemon.pid", tmp_path / "escape.pid", tmp_path / "other.pid"
    engine = [sys.executable, FAKE, "--model", str(model), "--port", str(free_port()),
              "--daemon", str(daemon_file), "--escape", str(escape_file)]
    first = Run(tmp_path, engine).start()
    second: Run | None = None
    other: int | None = None
    try:
        assert eventually(lambda: daemon_file.exists() and escape_file.exists(), 30)
        daemon, escaped = int(daemon_file.read_text()), int(escape_file.read_text())
        # Ready, with the setsid'd daemon (adopted by kvwatch, its subreaper) recorded in the tree.
        data = first.wait("ready", lambda d: d["state"] == "ready" and escaped in [p["pid"] for p in d["pids"]], 30)
        proof = EngineProof.from_json(data["engine_proof"])
        assert proof.pid == data["pids"][0]["pid"] and proof.sid == proof.pid
        lookalike(other_file)
        other = int(other_file.read_text())
        old = {ref.pid: ref for ref in session_of(proof.sid)}
        for pid in (escaped, daemon):
            old[pid] = ProcRef(pid, psutil.Process(pid).create_time())
        assert len(old) >= 4   # API server, EngineCore stand-in, the daemon, the setsid'd one
        first.kill_with_reaper()
        left = {pid: ref for pid, ref in old.items() if running(ref.pid, ref.create_time)}
        assert daemon in left and escaped in left and len(left) >= 3, left   # the API server may go (pdeathsig)

        # The next kvwatch runs another command (another port): the proof is kept all the same.
        second = Run(tmp_path, [*engine[:-5], str(free_port()), *engine[-4:]]).start()
        data = second.wait("ready", lambda d: d["state"] == "ready", 30)
        assert [pid for pid, ref in left.items() if running(pid, ref.create_time)] == []
        stopped = re.search(r"leftovers: stopped our earlier engine processes \[([\d, ]+)\]", second.log())
        assert stopped is not None, second.log()
        # The two daemons never end by themselves: the next kvwatch ended them. The rest of `left` is
        # gone too (above); the API server may have ended on its own meanwhile (its parent-death signal).
        assert {daemon, escaped} <= {int(p) for p in stopped.group(1).split(",")}
        # The lookalike: reported, never signalled.
        assert running(other, psutil.Process(other).create_time())
        assert any(f"pid {other} " in line for line in data["escaped"]), data["escaped"]
        assert f"escaped: pid {other} " in second.log()
        # The exporter's page is built every watch interval: the count shows on one of the next pages.
        escaped_series = re.compile(r'^kvwatch_engine_escaped_processes\{engine="own"\} ([0-9.]+)$', re.M)

        def escaped_count() -> float:
            found = escaped_series.search(http_get(f"http://127.0.0.1:{second.port}/metrics")[1])
            return float(found.group(1)) if found else 0.0
        assert eventually(lambda: escaped_count() >= 1, 15)
        assert eventually(lambda: daemon_file.read_text() != str(daemon), 15)
        new_daemon = ProcRef(int(daemon_file.read_text()), psutil.Process(int(daemon_file.read_text())).create_time())
        assert second.stop() == 0
        # The stop ends the new engine's daemon too (the same proof, from this kvwatch's own spawn).
        assert eventually(lambda: not running(new_daemon.pid, new_daemon.create_time), 15)
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.proc.kill()
        if second is not None and second.proc is not None and second.proc.poll() is None:
            second.stop()   # ends its engine and the engine's daemons
        for pid_file in (daemon_file, escape_file):   # a failed test may leave the first launch's daemons
            try:
                pid = int(pid_file.read_text())
                if psutil.Process(pid).name() == "VLLM::Daemon":   # never a reused pid's stranger
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, psutil.Error):
                pass
        if other is not None:
            try:
                os.kill(other, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.engine
def test_on_the_real_engine_every_process_of_a_killed_kvwatch_is_proven_and_ended(tmp_path: Path) -> None:
    """The real CPU engine under `kvwatch run`: vLLM retitles EngineCore (VLLM::EngineCore) with
    setproctitle, which overwrites the environment /proc shows. kill -9 of kvwatch and its reaper,
    the engine's tree frozen first (SIGSTOP) so that it cannot end itself on the API server's
    parent-death signal before the next kvwatch looks: the test measures kvwatch's proof, not
    vLLM's shutdown. Every process of the old tree is proven the engine's from the state file, and
    the next kvwatch ends all of them before it launches."""
    require_engine()
    model = write_model(tmp_path / "tiny", llama_config())
    env = engine_env(1)
    first = Run(tmp_path, engine_argv(model, free_port()), start_timeout=240, env=env).start()
    frozen: dict[int, ProcRef] = {}
    second: Run | None = None
    try:
        data = first.wait("ready", lambda d: d["state"] == "ready" and len(d["pids"]) >= 2, 240)
        proof = EngineProof.from_json(data["engine_proof"])
        tree = {ref.pid: ref for ref in session_of(proof.sid)}
        names = {pid: psutil.Process(pid).name() for pid in tree}
        assert any(n.startswith("VLLM::") for n in names.values()), names   # vLLM's own titles
        for pid in tree:
            os.kill(pid, signal.SIGSTOP)
        frozen = tree
        first.kill_with_reaper()
        recorded = [ProcRef(p["pid"], p["create_time"]) for p in first.state()["pids"]]
        judged = leftovers.scan(proof, recorded).judged
        verdicts = {pid: judged[pid].verdict for pid in tree if pid in judged}
        assert verdicts and set(verdicts.values()) == {Verdict.OWN}, {pid: (names[pid], judged[pid].why)
                                                                      for pid in verdicts}
        assert set(verdicts) == set(tree)
        marker_read = {pid: leftovers.MARKER_ENV in psutil.Process(pid).environ() for pid in tree}
        for pid in sorted(tree):
            print(f"[ownership] pid {pid} {names[pid]!r}: {judged[pid].why}; marker readable: {marker_read[pid]}")

        second = Run(tmp_path, engine_argv(model, free_port()), start_timeout=240, env=env).start()
        second.wait("launched", lambda d: d["state"] == "starting", 60)
        assert [pid for pid, ref in tree.items() if running(pid, ref.create_time)] == []
        stopped = re.search(r"leftovers: stopped our earlier engine processes \[([\d, ]+)\]", second.log())
        assert stopped is not None, second.log()
        assert set(tree) <= {int(p) for p in stopped.group(1).split(",")}
        assert second.stop() == 0
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.proc.kill()
        if second is not None and second.proc is not None and second.proc.poll() is None:
            second.stop()
        for pid, ref in frozen.items():
            if running(pid, ref.create_time):
                os.kill(pid, signal.SIGKILL)
