"""A state directory that fills, turns read-only or freezes (issue 30): the watchdog never waits on
its disk. Supervision goes on (relaunches counted), readiness tells the truth, a stop is honoured
within the stop timeout, nothing is corrupt and nothing is left behind.

The filesystem faults are real: a tmpfs filled up, a tmpfs remounted read-only, an ext4 image
frozen with fsfreeze (root and a loop device; skipped where the machine has neither)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import free_port, llama_config, write_model
from test_supervisor import Running, fake, supervisor
from waiting import eventually

from kvwatch.engine_status import EngineState
from kvwatch.exitcodes import EXIT_OK
from kvwatch.policy import Policy
from kvwatch.watchdog.config import Config, EngineConfig
from kvwatch.watchdog.disk_writer import DiskWriter
from kvwatch.watchdog.state_store import StateStore

REPO = Path(__file__).resolve().parent.parent
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounts need root")
POLICY = Policy(backoff_initial_seconds=0.05, backoff_max_seconds=0.2, max_restarts=20, max_corrections=3,
                restart_window_seconds=600, stable_seconds=600)


# -- the writer itself ------------------------------------------------------------------------------

def test_the_writer_returns_at_once_and_keeps_only_the_newest_content(tmp_path: Path) -> None:
    gate, written = threading.Event(), []

    def slow_write(path: Path, data: bytes) -> None:
        gate.wait(10)
        written.append(data)

    writer = DiskWriter(slow_write)
    for i in range(100):
        writer.put(tmp_path / "a", str(i).encode())
    # nobody waited on the disk: every put returned while no write could finish (the gate is shut;
    # a put that waited would have returned only after a write, which ends with `written` filled)
    assert written == []
    assert not writer.flush(0.2)                   # bounded: the disk does not answer
    gate.set()
    assert writer.flush(5)
    assert written[-1] == b"99" and len(written) <= 2   # the first, then only the newest


def test_a_failed_write_is_said_once_retried_and_the_newest_content_wins(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    calls: list[bytes] = []
    full = {"on": True}

    def write(path: Path, data: bytes) -> None:
        calls.append(data)
        if full["on"]:
            raise OSError(28, "No space left on device")

    writer = DiskWriter(write, retry_seconds=0.05)
    writer.put(tmp_path / "a", b"1")
    assert eventually(lambda: len(calls) >= 3, 5, 0.01)           # retried
    assert caplog.text.count("No space left on device") == 1       # said once
    assert writer.failing() == {str(tmp_path / "a"): "No space left on device"}
    writer.put(tmp_path / "a", b"2")
    full["on"] = False
    assert writer.flush(5) and calls[-1] == b"2" and writer.failing() == {}


# -- filesystems that fail -----------------------------------------------------------------------------

@contextlib.contextmanager
def tmpfs(path: Path, size: str = "256k") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> None:
    with open(directory / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)


def engine_config(state: Path, argv: list[str]) -> Config:
    return Config(name="t", state_dir=str(state), policy=POLICY,
                  engine=EngineConfig(command=tuple(argv), start_timeout_seconds=20.0, health_interval_seconds=0.2,
                                      hang_timeout_seconds=1.5, stop_timeout_seconds=3.0))


@ROOT_ONLY
def test_kvwatch_run_serves_on_a_full_state_directory_and_says_so_once(tmp_path: Path) -> None:
    model = write_model(tmp_path / "tiny", llama_config())
    port = free_port()
    with tmpfs(tmp_path / "mnt") as mnt:
        (mnt / "state").mkdir()
        fill(mnt)
        listen = f"127.0.0.1:{free_port()}"
        proc = subprocess.Popen([sys.executable, "-m", "kvwatch.cli", "run", "--state-dir", str(mnt / "state"),
                                 "--listen", listen, "--device", "cpu", "--no-preflight", "--",
                                 *fake(model, port)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            import urllib.request

            def ready() -> bool:
                try:
                    with urllib.request.urlopen(f"http://{listen}/-/ready", timeout=2) as r:
                        return r.status == 200
                except OSError:
                    return False
            assert eventually(ready, 30, 0.2), "kvwatch did not serve on a full state directory"
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == EXIT_OK, err[-2000:]
        assert "Traceback" not in err
        assert err.count("No space left on device") <= 3     # the lock's pid, the state file, the claim: once each
        assert not [n for n in os.listdir(mnt / "state") if n.endswith(".tmp")]


@ROOT_ONLY
def test_a_read_only_state_directory_stops_nothing_and_the_file_is_rewritten_after(tmp_path: Path) -> None:
    model = write_model(tmp_path / "tiny", llama_config())
    died = tmp_path / "died"
    with tmpfs(tmp_path / "mnt", size="4m") as mnt:
        cfg = engine_config(mnt / "state", fake(model, free_port(), "--die-after", "1.0", "--die-once", str(died)))
        run = Running(supervisor(cfg))
        try:
            run.wait_state(EngineState.READY)
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
            assert eventually(died.exists, 10, 0.05)                        # the engine died once
            assert eventually(lambda: run.sup.status.restarts and run.sup.state is EngineState.READY, 20, 0.05)
            subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
            path = mnt / "state" / "t.json"
            assert eventually(lambda: path.exists() and sum(json.loads(path.read_text())["restarts"].values()) == 1,
                              15, 0.2)                                       # retried once writable again
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=False)
            assert run.stop() == EXIT_OK


def _can_freeze() -> bool:
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("fsfreeze", "mkfs.ext4", "mount")) \
        and os.path.exists("/dev/loop-control")


@pytest.mark.skipif(not _can_freeze(), reason="needs root, a loop device, mkfs.ext4 and fsfreeze")
def test_a_frozen_state_directory_never_holds_the_watchdog(tmp_path: Path) -> None:
    """A hung network volume, as fsfreeze makes one: every write blocks until the thaw. The engine
    dies while it is frozen: it is relaunched, readiness is 503 then 200 again, and a stop is done
    within the stop timeout (the writer stays blocked in the kernel until the thaw)."""
    model = write_model(tmp_path / "tiny", llama_config())
    image, mnt, died = tmp_path / "fs.img", tmp_path / "mnt", tmp_path / "died"
    subprocess.run(["truncate", "-s", "32M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    thaw = threading.Timer(60, lambda: subprocess.run(["fsfreeze", "-u", str(mnt)], check=False))  # never left frozen
    try:
        cfg = engine_config(mnt / "state", fake(model, free_port(), "--die-after", "1.5", "--die-once", str(died)))
        run = Running(supervisor(cfg))
        run.wait_state(EngineState.READY)
        subprocess.run(["fsfreeze", "-f", str(mnt)], check=True)
        thaw.start()
        seen: list[EngineState] = []

        def relaunched() -> bool:
            if run.sup.status.restarts and run.sup.state is EngineState.READY:
                return True
            seen.append(run.sup.state)
            return False
        eventually(relaunched, 20)
        assert run.sup.status.restarts, f"no relaunch while the disk was frozen: {run.sup.status}"
        assert run.sup.state is EngineState.READY and {EngineState.BACKOFF, EngineState.STARTING} & set(seen)
        start = time.monotonic()
        assert run.stop(timeout=cfg.engine.stop_timeout_seconds + 5) == EXIT_OK
        assert time.monotonic() - start < cfg.engine.stop_timeout_seconds + 3   # the stop timeout, plus the flush bound
    finally:
        subprocess.run(["fsfreeze", "-u", str(mnt)], check=False)
        thaw.cancel()
        time.sleep(0.5)
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_temporary_files_left_by_a_kill_mid_write_are_removed_at_start(tmp_path: Path) -> None:
    """kill -9 between mkstemp and rename leaves `.NAME.json.XXXX.tmp`: the next start removes this
    engine's (it holds the engine's lock), never another engine's."""
    state = tmp_path / "state"
    store = StateStore(str(state), "t")
    store.ensure_dir()
    for i in range(8):
        (state / f".t.json.x{i}.tmp").write_bytes(b"{half")
    (state / ".other.json.x.tmp").write_bytes(b"{")
    assert store.remove_stale_temporaries() == 8
    assert sorted(os.listdir(state)) == [".other.json.x.tmp"]


def test_kill_9_during_writes_leaves_a_valid_file_and_the_next_start_cleans_up(tmp_path: Path) -> None:
    state = tmp_path / "state"
    StateStore(str(state), "t").ensure_dir()
    code = ("import sys; from kvwatch.watchdog.state_store import EngineRecord, StateStore\n"
            "s = StateStore(sys.argv[1], 't')\n"
            "r = EngineRecord(name='t', argv=['vllm', 'serve', 'x' * 20000])\n"
            "print('go', flush=True)\n"
            "while True: s.save(r)\n")
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", code, str(state)], cwd=REPO, stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"go\n"
        time.sleep(0.05)
        proc.kill()
        proc.wait()
        if (state / "t.json").exists():
            assert StateStore(str(state), "t").load() is not None     # never a half file
    StateStore(str(state), "t").remove_stale_temporaries()
    assert not [n for n in os.listdir(state) if n.endswith(".tmp")]


def test_a_state_directory_removed_while_running_is_made_again_private(tmp_path: Path) -> None:
    from kvwatch.watchdog.disk_writer import shared
    from kvwatch.watchdog.state_store import EngineRecord
    state = tmp_path / "state"
    store = StateStore(str(state), "t", writer=shared())
    store.ensure_dir()
    store.save(EngineRecord(name="t"))
    assert shared().flush(5)
    shutil.rmtree(state)                                 # an operator's cleanup, a volume remounted empty
    store.save(EngineRecord(name="t", argv=["vllm", "serve", "m"]))
    assert shared().flush(5)
    assert state.stat().st_mode & 0o7777 == 0o750 and store.load() is not None
