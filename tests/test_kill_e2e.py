"""A crash is a restart, never a verdict (issue 42), on the real vLLM CPU engine under `kvwatch run`.

kill -9 of the engine's API server at three moments: while the model loads, right after its first /health
200 (before kvwatch's own probe, every second, can see it), and while it serves. Each is restarted with the
same plan and named as a kill; kvwatch never gives up. The same holds with kvwatch as PID 1 of a PID namespace
(as in a container) and with a CPU load running beside it. One kvwatch run shares its engine across moments.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from engine_support import engine_argv, free_port, http_get, llama_config, write_model
from test_watchdog_e2e import Kvwatch, engine_processes, log
from waiting import eventually

pytestmark = pytest.mark.engine

LOAD_LINES = ("Starting to load model", "Loading weights took", "Model loading took")


def api_server(kv: Kvwatch) -> int | None:
    """The engine's API server, by host pid: the engine process whose parent is not the engine's."""
    pids = set(engine_processes(kv.marker()))
    for pid in pids:
        try:
            if psutil.Process(pid).ppid() not in pids:
                return pid
        except psutil.Error:
            continue
    return None


def engine_output(kv: Kvwatch) -> str:
    return kv.log_path.read_text(errors="replace")


def kill_api_server(kv: Kvwatch) -> int:
    pid = api_server(kv)
    assert pid is not None, kv.tail()
    psutil.Process(pid).kill()
    return pid


def running(kv: Kvwatch) -> None:
    assert kv.proc is not None
    if kv.proc.poll() is not None:
        raise AssertionError(f"kvwatch exited {kv.proc.returncode}\n{kv.tail()}")


def kill_while_loading(kv: Kvwatch, seen: int) -> None:
    """As soon as the engine prints, after offset `seen` of the output, that it loads the model."""
    def loading() -> bool:
        running(kv)
        return any(m in engine_output(kv)[seen:] for m in LOAD_LINES)
    assert eventually(loading, 300, interval=0.05), kv.tail()
    kill_api_server(kv)


def kill_right_after_first_health(kv: Kvwatch, port: int) -> float:
    """Poll /health far faster than kvwatch's probe (1 s): kill the API server at its first 200."""
    started = time.monotonic()

    def healthy() -> bool:
        running(kv)
        return http_get(f"http://127.0.0.1:{port}/health", timeout=0.5)[0] == 200
    assert eventually(healthy, 300, interval=0.02), kv.tail()
    kill_api_server(kv)
    return time.monotonic() - started


def killed(state: dict) -> list[dict]:
    return [f for f in state.get("failures", []) if f["kind"] == "killed"]


def assert_restarted_as_a_kill(kv: Kvwatch, count: int, argv: list[str]) -> dict:
    state = kv.wait(f"kill {count} named", lambda d: len(killed(d)) >= count, timeout=120)
    assert state["state"] != "fatal", state["reason"]
    failure = killed(state)[-1]
    assert failure["evidence"].startswith("killed by signal 9 (SIGKILL) from outside"), failure
    assert "Tokenizer" not in failure["evidence"] and "WARNING" not in failure["evidence"]
    assert failure["argv"] == argv and state["argv"] == argv          # the same plan
    assert not any("gave up" in line for line in kv.kvwatch_lines())
    return state


class NamespacedKvwatch(Kvwatch):
    """kvwatch as PID 1 of its own PID namespace, as a container's entrypoint is."""

    def __init__(self, tmp: Path, name: str, engine: list[str]) -> None:
        super().__init__(tmp, name, engine)
        self.argv = ["unshare", "--pid", "--fork", "--mount-proc", *self.argv]

    def wait_ready(self) -> dict:
        return self.wait("ready", lambda d: d["state"] == "ready" and d.get("kvwatch_pid") == 1
                         and len(d["pids"]) >= 2)

    def terminate(self) -> None:
        """SIGTERM to kvwatch itself (PID 1 inside), not to `unshare` that waits for it."""
        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children():
            child.terminate()

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate()
            except psutil.Error:
                pass
        super().cleanup()


def namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30)
    return done.returncode == 0


def three_kills(kv: Kvwatch, port: int, engine: list[str]) -> None:
    t0 = time.monotonic()
    kv.start()
    kill_while_loading(kv, 0)
    assert_restarted_as_a_kill(kv, 1, engine)
    log(f"{kv.name}: kill -9 while loading: restarted after {time.monotonic() - t0:.0f}s")

    race = kill_right_after_first_health(kv, port)
    state = assert_restarted_as_a_kill(kv, 2, engine)
    log(f"{kv.name}: kill -9 at the first /health 200 ({race:.0f}s into the launch): restarted")

    kv.wait_ready()
    kill_api_server(kv)
    assert_restarted_as_a_kill(kv, 3, engine)
    state = kv.wait_ready()
    log(f"{kv.name}: kill -9 while serving: serving again")
    assert state["restarts"] == {"killed": 3}
    assert state["corrections"] == [] and state["state"] == "ready"


def test_kill_9_at_three_moments_is_restarted_never_given_up(tmp_path: Path) -> None:
    model = write_model(tmp_path / "tiny", llama_config())
    port = free_port()
    engine = engine_argv(model, port)
    kv = Kvwatch(tmp_path, "kill9", engine, "--no-preflight")
    try:
        three_kills(kv, port, engine)
        assert kv.proc is not None
        kv.proc.terminate()
        assert kv.exit_code() == 0
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


def test_kill_9_with_kvwatch_as_pid_1_beside_a_cpu_load(tmp_path: Path) -> None:
    if not namespaces_work():
        pytest.skip("this host refuses `unshare --pid --fork --mount-proc`")
    model = write_model(tmp_path / "tiny", llama_config())
    port = free_port()
    engine = engine_argv(model, port)
    kv = NamespacedKvwatch(tmp_path, "pid1", engine)
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])   # one core busy all along
    try:
        three_kills(kv, port, engine)
        kv.terminate()
        assert kv.exit_code() == 0
    finally:
        load.kill()
        load.wait()
        kv.cleanup()
    assert engine_processes(kv.marker()) == []
