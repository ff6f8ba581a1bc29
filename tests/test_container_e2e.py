"""kvwatch as a container's entrypoint: PID 1 of a new PID namespace, supervising the real CPU engine.

`unshare --pid --fork --mount-proc` (root, as this machine and CI run) gives kvwatch PID 1, as a
container runtime does: every orphan of the namespace is re-parented to it, signals it has no
handler for are ignored, and when it exits the kernel ends the namespace. The readiness endpoint
(/-/ready) is polled the whole time, as a kubelet would.
"""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from engine_support import engine_argv, free_port, http_get
from test_watchdog_e2e import START, Kvwatch, engine_processes, log
from waiting import eventually

from kvwatch.exitcodes import EXIT_GAVE_UP

pytestmark = pytest.mark.engine
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM"]


class Pid1(Kvwatch):
    """`kvwatch run` as PID 1 of a new PID namespace (the state file then names namespace pids)."""

    def __init__(self, tmp: Path, name: str, engine: list[str]) -> None:
        super().__init__(tmp, name, engine)
        self.argv = [*UNSHARE, *self.argv]
        self.ready_url = "http://" + self.argv[self.argv.index("--listen") + 1] + "/-/ready"

    def kvwatch(self) -> psutil.Process:
        """kvwatch itself, seen from outside: unshare's child, PID 1 inside."""
        assert self.proc is not None
        children = eventually(lambda: psutil.Process(self.proc.pid).children(), 30, interval=0.1)
        if not children:
            raise AssertionError("unshare started no child")
        return children[0]

    def wait_serving(self, failures: int) -> dict:
        return self.wait(f"ready with {failures} failure(s)",
                         lambda d: d["state"] == "ready" and len(d["failures"]) == failures and len(d["pids"]) >= 3)


def namespace_pid(proc: psutil.Process) -> int:
    """The process's pid inside its own (innermost) PID namespace."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError("no NSpid line")


class ReadyProbe:
    """Polls /-/ready every 0.2 s in a thread, keeping (code, body) of each answer."""

    def __init__(self, url: str) -> None:
        self.url, self.seen = url, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            code, body = http_get(self.url, timeout=2)
            if code:
                self.seen.append((code, body.strip()))

    def stop(self) -> list[tuple[int, str]]:
        self._stop.set()
        self._thread.join(5)
        return self.seen


def test_pid1_reaps_orphans_restarts_the_engine_and_stops_on_sigterm(tmp_path: Path, tiny: Path) -> None:
    kv = Pid1(tmp_path, "pid1", engine_argv(tiny, free_port()))
    probe = None
    try:
        t0 = time.monotonic()
        kv.start()
        probe = ReadyProbe(kv.ready_url)
        ready = kv.wait_serving(0)
        me = kv.kvwatch()
        assert namespace_pid(me) == 1
        log(f"PID 1: ready after {time.monotonic() - t0:.0f}s")

        tree = me.children(recursive=True)
        api = next(p for p in tree if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline()))
        cores = [p for p in tree if "EngineCore" in " ".join(p.cmdline())]
        assert cores, [p.cmdline() for p in tree]
        api.kill()   # EngineCore and the worker outlive it: orphans of the namespace, re-parented to PID 1
        again = kv.wait_serving(1)
        log(f"PID 1: API server killed, serving again after {time.monotonic() - t0:.0f}s")
        # killed from outside, and named so (issue 42), not a death of unknown cause
        assert again["failures"][0]["kind"] == "killed" and again["argv"] == ready["argv"]
        assert again["failures"][0]["evidence"].startswith("killed by signal 9 (SIGKILL) from outside")
        time.sleep(3)   # a few ticks of the reaper
        for core in cores:
            assert not psutil.pid_exists(core.pid) or core.status() != psutil.STATUS_ZOMBIE, "orphan not ended"
            assert not psutil.pid_exists(core.pid), f"orphan {core.pid} ended but not reaped"
        zombies = [p.pid for p in me.children(recursive=True) if p.status() == psutil.STATUS_ZOMBIE]
        assert zombies == []

        t1 = time.monotonic()
        me.send_signal(signal.SIGTERM)
        assert kv.exit_code(timeout=30) == 0
        log(f"PID 1: SIGTERM -> exit 0 in {time.monotonic() - t1:.1f}s")
        assert time.monotonic() - t1 < 20          # stop_timeout 15 s: inside a 30 s grace period
        seen = probe.stop()
        probe = None
        # readiness: 200 exactly while READY, 503 in every other state, and both were seen
        assert all((code == 200) == (state == "ready") for code, state in seen), seen
        assert (503, "starting") in seen and (200, "ready") in seen
        assert any(code == 503 and state in ("backoff", "starting") for code, state in
                   seen[seen.index((200, "ready")):]), "no 503 while the engine was down"
    finally:
        if probe is not None:
            probe.stop()
        kv.cleanup()
    assert engine_processes(kv.marker()) == []


def test_pid1_exits_78_when_no_remedy_is_left(tmp_path: Path, tiny: Path) -> None:
    kv = Pid1(tmp_path, "pid1bad", engine_argv(tiny, free_port(), "--tensor-parallel-size", "3"))
    try:
        kv.start()
        assert kv.exit_code(timeout=START) == EXIT_GAVE_UP   # what the kubelet sees: no restart helps
        assert kv.state()["state"] == "fatal"
    finally:
        kv.cleanup()
    assert engine_processes(kv.marker()) == []
