"""kvwatch's writes through a helper process (kvwatch/watchdog/write_helper.py): a write blocked in
a frozen filesystem holds the helper, never kvwatch's own exit; and the callers that wrote on the
watchdog's or the exporter's thread hand their writes over (a fake blocking writer, as in
tests/test_disk_faults.py: no host filesystem is frozen here)."""
from __future__ import annotations

import errno
import json
import os
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
    with pytest.raises(OSError, match="write helper ended"):
        helper.write_private(tmp_path / "s" / "a.json", b"2")
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
    start = time.monotonic()
    learned_store.publish(str(tmp_path / "fleet"), EngineCommand(("vllm", "serve", str(model))), gpu,
                          40 << 30, 30 << 30)
    assert time.monotonic() - start < 1.0 and not written   # handed over, the disk not waited on
    gate.set()
    assert writer.flush(10) and len(written) == 1 and written[0].parent == tmp_path / "fleet"


def test_a_claim_never_makes_the_watch_loop_wait_on_the_state_dir(tmp_path: Path) -> None:
    from kvwatch.watchdog.host_registry import HostRegistry
    writer, gate, written = _blocking_writer()
    registry = HostRegistry(str(tmp_path / "missing" / "state"), "e", writer=writer)
    start = time.monotonic()
    registry.publish([os.getpid()])
    registry.publish([os.getpid(), 1])
    assert time.monotonic() - start < 1.0
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
