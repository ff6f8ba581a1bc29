"""kvwatch's writes through a helper process (kvwatch/watchdog/write_helper.py): a write blocked in
a frozen filesystem holds the helper, never kvwatch's own exit; and the callers that wrote on the
watchdog's or the exporter's thread hand their writes over (a fake blocking writer, as in
tests/test_disk_faults.py: no host filesystem is frozen here)."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from waiting import eventually

from kvwatch.watchdog import disk_writer, learned_store
from kvwatch.watchdog.disk_writer import DiskWriter
from kvwatch.watchdog.write_helper import HelperProcess

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def helper():
    h = HelperProcess()
    yield h
    h.close()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_each_operation_does_what_its_caller_did_itself(tmp_path: Path, helper: HelperProcess) -> None:
    os.umask(0o022)
    helper.write_private(tmp_path / "state" / "e.json", b"state")
    assert (tmp_path / "state" / "e.json").read_bytes() == b"state" and _mode(tmp_path / "state") == 0o750
    helper.write_claim(tmp_path / "s2" / "engines" / "e.json", b"claim")
    assert _mode(tmp_path / "s2") == 0o750 and _mode(tmp_path / "s2" / "engines") == 0o750
    helper.write_plain(tmp_path / "fleet" / "a" / "p.json", b"profile")
    assert (tmp_path / "fleet" / "a" / "p.json").read_bytes() == b"profile"
    helper.remove(tmp_path / "state" / "e.json")
    helper.remove(tmp_path / "state" / "e.json")          # already gone: no error
    assert not (tmp_path / "state" / "e.json").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError) as info:                  # the helper's errno reaches the caller
        helper.write_plain(tmp_path / "file" / "x.json", b"x")
    assert info.value.errno in (errno.ENOTDIR, errno.EEXIST)
    helper.write_private(tmp_path / "state" / "e.json", b"after an error")   # and it serves on
    assert (tmp_path / "state" / "e.json").read_bytes() == b"after an error"
    assert not list((tmp_path / "state").glob("*.tmp"))


def test_a_helper_that_died_fails_one_write_and_the_next_starts_another(tmp_path: Path,
                                                                        helper: HelperProcess) -> None:
    helper.write_private(tmp_path / "s" / "a.json", b"1")
    first = helper.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    try:   # the write in flight when it died fails; one after its death is already the new helper's
        helper.write_private(tmp_path / "s" / "a.json", b"2")
    except OSError as exc:
        assert "write helper ended" in str(exc)
    helper.write_private(tmp_path / "s" / "a.json", b"3")   # the disk writer's retry
    assert helper.pid not in (None, first) and (tmp_path / "s" / "a.json").read_bytes() == b"3"


_KVWATCH_LIKE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kvwatch.watchdog import disk_writer
    target = Path(sys.argv[1])
    writer = disk_writer.shared()
    writer.put(target, b"first")
    assert writer.flush(30)
    print(disk_writer._HELPERS["state_dir"].pid, flush=True)
    sys.stdin.readline()                     # the test has stopped the helper: its disk "froze"
    writer.put(target, b"second")
    print("flushed" if writer.flush(0.5) else "not flushed", flush=True)
""")


def test_a_helper_that_never_answers_never_holds_kvwatchs_exit(tmp_path: Path) -> None:
    # SIGSTOP stands in for a write blocked in a frozen filesystem: the helper does not answer.
    target = tmp_path / "state" / "t.json"
    child = subprocess.Popen([sys.executable, "-c", _KVWATCH_LIKE, str(target)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.stdout is not None and child.stdin is not None
    helper_pid = int(child.stdout.readline())
    try:
        os.kill(helper_pid, signal.SIGSTOP)
        start = time.monotonic()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "not flushed"
        assert child.wait(timeout=10) == 0
        assert time.monotonic() - start < 5            # the flush bound, not the disk's
        assert target.read_bytes() == b"first"
    finally:
        os.kill(helper_pid, signal.SIGCONT)            # the disk "thaws": the helper writes, then ends
    eventually(lambda: target.read_bytes() == b"second", 10)
    eventually(lambda: not Path(f"/proc/{helper_pid}").exists() or
               Path(f"/proc/{helper_pid}/stat").read_text().split(")")[1].split()[0] == "Z", 10)


def _blocking_writer() -> tuple[DiskWriter, threading.Event, list[Path]]:
    gate, written = threading.Event(), []

    def write(path: Path, data: bytes) -> None:
        gate.wait(30)
        written.append(path)

    return DiskWriter(write, lambda path: gate.wait(30)), gate, written


def test_sharing_a_learned_profile_never_waits_on_the_learned_dir(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from engine_support import llama_config, write_model

    from kvwatch.planner.devices import Device
    from kvwatch.planner.engine_args import EngineCommand
    writer, gate, written = _blocking_writer()
    monkeypatch.setitem(disk_writer._SHARED, "learned", writer)
    model = write_model(tmp_path / "tiny", llama_config())
    gpu = Device("cuda", "NVIDIA H100 80GB HBM3", compute_capability=(9, 0), total_memory_bytes=80 << 30)
    learned_store.publish(str(tmp_path / "fleet"), EngineCommand(("vllm", "serve", str(model))), gpu,
                          40 << 30, 30 << 30)
    assert not written   # handed over, the disk not waited on: no write can finish while the gate is shut
    gate.set()
    assert writer.flush(10) and len(written) == 1 and written[0].parent == tmp_path / "fleet"


def test_a_claim_never_makes_the_watch_loop_wait_on_the_state_dir(tmp_path: Path) -> None:
    from kvwatch.watchdog.host_registry import HostRegistry
    writer, gate, written = _blocking_writer()
    registry = HostRegistry(str(tmp_path / "missing" / "state"), "e", writer=writer)
    registry.publish([os.getpid()])
    registry.publish([os.getpid(), 1])
    assert not written   # both returned while no write could finish: the caller never waited on the disk
    assert not (tmp_path / "missing").exists()   # not even a directory made on the caller's thread
    gate.set()
    assert writer.flush(10) and written


def test_the_claims_writer_makes_the_state_dir_private(tmp_path: Path) -> None:
    from kvwatch.watchdog.host_registry import HostRegistry
    registry = HostRegistry(str(tmp_path / "state"), "e")
    registry.publish([os.getpid()])
    assert registry.flush(30)
    assert _mode(tmp_path / "state") == 0o750 and _mode(tmp_path / "state" / "engines") == 0o750
    assert json.loads((tmp_path / "state" / "engines" / "e.json").read_text())["name"] == "e"


def test_the_lock_files_pid_is_written_in_place(tmp_path: Path, helper: HelperProcess) -> None:
    lock = tmp_path / "e.lock"
    lock.write_text("12345678\n")
    inode = lock.stat().st_ino
    helper.write_in_place(lock, b"42\n")
    assert lock.read_text() == "42\n" and lock.stat().st_ino == inode   # the same file: the flock stays on it


def test_a_lock_taken_on_a_disk_that_does_not_answer_starts_all_the_same(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    from kvwatch.errors import KvwatchError
    from kvwatch.watchdog import state_store
    writer, gate, _ = _blocking_writer()
    monkeypatch.setitem(disk_writer._SHARED, "lock", writer)
    monkeypatch.setattr(state_store, "LOCK_PID_SECONDS", 0.3)
    first, second = state_store.EngineLock(tmp_path, "e"), state_store.EngineLock(tmp_path, "e")
    start = time.monotonic()
    first.acquire()
    assert time.monotonic() - start < 3 and "pid not written yet" in caplog.text
    with pytest.raises(KvwatchError, match=r"another kvwatch \(pid \?\)"):   # held all the same
        second.acquire()
    gate.set()
    first.release()


def test_a_path_the_protocol_cannot_carry_is_an_oserror_not_a_dead_thread(helper: HelperProcess) -> None:
    with pytest.raises(OSError) as info:
        helper.write_private(Path("/" + "x" * 70000), b"")
    assert info.value.errno == errno.ENAMETOOLONG


def _kvwatch_run(tmp_path: Path, state: Path) -> tuple[subprocess.Popen[str], str]:
    """`kvwatch run` of the fake engine, its state in `state`: relaunches 60 s apart, a 30 s watch."""
    from engine_support import free_port, llama_config, write_model

    model = write_model(tmp_path / "tiny", llama_config())
    listen, port = f"127.0.0.1:{free_port()}", free_port()
    config = tmp_path / "kvwatch.toml"
    config.write_text(f"""name = "t"
listen = "{listen}"
state_dir = "{state}"
[engine]
command = {json.dumps([sys.executable, str(REPO / 'tests' / 'fake_engine.py'), '--model', str(model),
                       '--port', str(port)])}
health_interval_seconds = 0.2
stop_timeout_seconds = 3.0
[policy]
preflight = false
backoff_initial_seconds = 60
backoff_max_seconds = 60
[watch]
interval_seconds = 30
""")
    kv = subprocess.Popen([sys.executable, "-m", "kvwatch.cli", "run", "--config", str(config), "--device", "cpu"],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    return kv, listen


def _engine_up(listen: str) -> float | None:
    from engine_support import http_get
    from exporter_support import samples, value
    try:
        return value(samples(http_get(f"http://{listen}/metrics", 2)[1]), "kvwatch_engine_up", engine="t")
    except OSError:
        return None


def _kill_engine_then_sigterm(kv: subprocess.Popen[str], listen: str) -> None:
    """The engine dies: kvwatch_engine_up 0 within 2.5 s (not the 30 s interval); SIGTERM: gone within 8 s."""
    import psutil
    engine = next(c for c in psutil.Process(kv.pid).children() if "fake_engine.py" in " ".join(c.cmdline()))
    engine.kill()
    start = time.monotonic()
    eventually(lambda: _engine_up(listen) == 0, 5, 0.05)
    assert time.monotonic() - start < 2.5, "kvwatch_engine_up followed the interval, not the engine"
    start = time.monotonic()
    kv.send_signal(signal.SIGTERM)
    _, err = kv.communicate(timeout=30)
    assert time.monotonic() - start < 8 and kv.returncode == 0, err[-2000:]
    assert "Traceback" not in err


def test_kvwatch_run_with_a_disk_that_never_answers_tells_the_truth_and_honours_sigterm(tmp_path: Path) -> None:
    """The fault runs' frozen state directory, with the write helpers stopped (SIGSTOP) in its place."""
    import psutil
    from engine_support import http_get

    kv, listen = _kvwatch_run(tmp_path, tmp_path / "state")
    stopped: list[psutil.Process] = []
    try:
        eventually(lambda: _engine_up(listen) == 1 and http_get(f"http://{listen}/-/ready", 2)[0] == 200, 60, 0.2)
        stopped = [c for c in psutil.Process(kv.pid).children()
                   if "kvwatch.watchdog.write_helper" in " ".join(c.cmdline())]
        assert stopped, "no write helper"
        for helper in stopped:
            helper.suspend()                     # the disk "freezes": no write is ever answered
        _kill_engine_then_sigterm(kv, listen)
    finally:
        for helper in stopped:
            with contextlib.suppress(psutil.Error):
                helper.resume()
        if kv.poll() is None:
            kv.kill()
            kv.wait()


def _can_freeze() -> bool:
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("fsfreeze", "mkfs.ext4", "mount")) \
        and os.path.exists("/dev/loop-control")


@pytest.mark.skipif(not _can_freeze(), reason="needs root, a loop device, mkfs.ext4 and fsfreeze")
def test_kvwatch_run_exits_on_sigterm_with_its_state_disk_really_frozen(tmp_path: Path) -> None:
    """The same on a real frozen filesystem (an ext4 image of its own, never the host's): a write
    blocked there cannot be interrupted, and it is the helper's, so kvwatch's process still ends."""
    from engine_support import http_get

    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    subprocess.run(["truncate", "-s", "32M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    thaw = threading.Timer(60, lambda: subprocess.run(["fsfreeze", "-u", str(mnt)], check=False))  # never left frozen
    kv, listen = _kvwatch_run(tmp_path, mnt / "state")
    try:
        eventually(lambda: _engine_up(listen) == 1 and http_get(f"http://{listen}/-/ready", 2)[0] == 200, 60, 0.2)
        subprocess.run(["fsfreeze", "-f", str(mnt)], check=True)
        thaw.start()
        _kill_engine_then_sigterm(kv, listen)
    finally:
        subprocess.run(["fsfreeze", "-u", str(mnt)], check=False)
        thaw.cancel()
        if kv.poll() is None:
            kv.kill()
            kv.wait()
        time.sleep(0.5)   # the helper finishes its write after the thaw, then ends
        subprocess.run(["umount", "-l", str(mnt)], check=False)
