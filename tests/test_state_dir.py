"""The state directory is not trusted (issue 15, item 4): a symlinked lock, a FIFO or a link to a
device named like a state file, a state file of the wrong shape: one clear line, no hang, no
traceback, and nothing outside the directory touched."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.errors import KvwatchError
from kvwatch.planner.flag_change import NO_CHANGE
from kvwatch.watchdog.state_store import CorrectionRecord, EngineLock, EngineRecord, StateStore, load_all

REPO = Path(__file__).resolve().parents[1]


def status(state_dir: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvwatch.cli", "status", "--state-dir", str(state_dir)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "e.lock").symlink_to(victim)
    with pytest.raises(KvwatchError, match="symlink"):
        EngineLock(str(state), "e").acquire()
    assert victim.read_text() == "precious\n"


def test_a_fifo_or_a_device_link_as_state_file_neither_hangs_nor_eats_memory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "fifo.json")
    (state / "zero.json").symlink_to("/dev/zero")
    records = dict((p.name, r) for p, r in load_all(state))   # returns at all: a FIFO opened blocking would hang
    assert records == {"fifo.json": None, "zero.json": None}
    out = status(state)
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr
    store = StateStore(str(state), "fifo")
    assert store.load() is None                       # moved aside, not read
    assert not (state / "fifo.json").exists()


_FAILURE = {"kind": "oom", "evidence": None, "time": 1.0, "argv": ["vllm"]}
_CORRECTION = CorrectionRecord("oom", NO_CHANGE, "r", 1.0, ["vllm"], ["vllm"]).to_json()


# (field, value, corrupt): a corrupt file is moved aside; the others load, and `status` shows them
@pytest.mark.parametrize("field,value,corrupt", [
    ("argv", "vllm serve m", True), ("pids", [{"pid": "1"}], True), ("state", 7, True),
    ("failures", [{"kind": 5}], True), ("restarts", {"x": "y"}, True),
    ("plans_tried", [[1, 2]], True), ("updated", "yesterday", True),
    ("kvwatch_pid", "12", True), ("kvwatch_pid", -1, True), ("kvwatch_pid", 10**30, True),
    ("pgid", "7", True), ("pids", [{"pid": 0, "create_time": 1.0}], True),
    ("kvwatch_create_time", "x", True), ("original_argv", 5, True), ("original_argv", None, False),
    ("original_argv", [1], True), ("foreign", [5], True), ("name", None, True),
    ("log_kv_tokens", "lots", True), ("log_available_kv_bytes", "lots", True), ("learned_non_kv", [], True), ("learned_non_kv", {"k": "x"}, True),
    ("log_kv_tokens", True, True), ("state", None, False),
    ("failures", [{**_FAILURE, "time": "yesterday"}], True), ("failures", [{**_FAILURE, "argv": "vllm"}], True),
    ("failures", [{**_FAILURE, "evidence": 5}], True), ("failures", [{**_FAILURE, "reason": 5}], True),
    ("corrections", [{**_CORRECTION, "time": "yesterday"}], True),
    ("corrections", [{**_CORRECTION, "to_argv": [1]}], True),
    ("updated", 1e300, False), ("corrections", [{**_CORRECTION, "time": 1e300}], False),
    ("failures", [{**_FAILURE, "time": 1e300}], False), ("updated", float("nan"), False),
])
def test_valid_json_of_the_wrong_shape_is_corrupt_not_a_traceback(tmp_path: Path, field: str, value: object,
                                                                   corrupt: bool) -> None:
    state = tmp_path / "state"
    state.mkdir()
    data = EngineRecord(name="e", argv=["vllm", "serve", "m"]).to_json()
    data[field] = value
    (state / "e.json").write_text(json.dumps(data))
    out = status(state)
    assert "Traceback" not in out.stderr, out.stderr
    if corrupt:
        assert "unreadable or corrupt" in out.stdout, out.stdout
        assert StateStore(str(state), "e").load() is None
    else:
        assert out.returncode == 0 and out.stdout.split()[:2] == ["engine", "e"], out.stdout
        assert StateStore(str(state), "e").load() is not None


def test_status_shows_engine_text_without_obeying_its_escapes(tmp_path: Path) -> None:
    """Evidence and reasons in a state file are the engine's text: an OSC title change, a BEL or a
    CR reach the terminal as \\xNN, not as control codes."""
    state = tmp_path / "state"
    store = StateStore(str(state), "e")
    store.ensure_dir()
    hostile = "pwned\x1b]0;owned title\x07\rgone"
    store.save(EngineRecord(name="e", argv=["vllm", "serve", "m"], original_argv=["vllm", "serve", "m"],
                            state="fatal", reason=hostile))
    out = status(state)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\r" not in out.stdout
    assert "pwned\\x1b]0;owned title\\x07\\x0dgone" in out.stdout


# -- who creates the state directory, and who could have written what is in it (issue 30) ----------

def _race_create(state: Path) -> None:
    """What `kvwatch run` (StateStore.ensure_dir) and `kvwatch export` (HostRegistry.publish) each do
    first, in two processes at once, under umask 000."""
    from kvwatch.watchdog.host_registry import HostRegistry
    children = []
    for job in ("run", "export"):
        pid = os.fork()
        if pid == 0:   # pragma: no cover - the child
            code = 0
            try:
                os.umask(0)
                if job == "run":
                    StateStore(str(state), "e").ensure_dir()
                else:
                    registry = HostRegistry(str(state), "x")
                    registry.publish([os.getpid()])
                    assert registry.flush(30)   # the claim's writer makes the directories
            except BaseException:
                code = 1
            os._exit(code)
        children.append(pid)
    for pid in children:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_the_state_directory_is_0750_whoever_creates_it_under_umask_000(tmp_path: Path) -> None:
    # The exporter's first claim used to create the directory (os.makedirs: intermediate directories
    # get 0777 & ~umask) before the supervisor set its mode: 0777 in 2 to 8 of 8 starts.
    for i in range(100):
        state = tmp_path / f"run{i}" / "state"
        _race_create(state)
        assert (state.stat().st_mode & 0o7777, (state / "engines").stat().st_mode & 0o7777) == (0o750, 0o750), i
        assert state.parent.stat().st_mode & 0o7777 == 0o755   # a parent kvwatch had to make: never writable by others


def _forge(path: Path, text: str, uid: int = 65534) -> None:
    path.write_text(text)
    os.chown(path, uid, -1)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_state_file_someone_else_wrote_is_never_launched(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = StateStore(str(state), "e")
    store.ensure_dir()
    record = EngineRecord(name="e", original_argv=["vllm", "serve", "m"], argv=["sh", "-c", "evil"])
    _forge(store.path, json.dumps(record.to_json()))                # an unprivileged user's file
    assert store.load() is None                                      # not read: its command never runs
    assert not store.path.exists() and list(state.glob("e.json.untrusted-*"))
    os.chown(state / next(state.glob("e.json.untrusted-*")).name, 0, -1)
    for mode, links in ((0o666, False), (0o640, True)):               # writable by others; a hard link
        store.path.write_text(json.dumps(record.to_json()))
        os.chmod(store.path, mode)
        if links:
            os.link(store.path, tmp_path / "elsewhere.json")
        assert store.load() is None
        assert not store.path.exists()
    store.save(record)                                               # kvwatch's own file is read
    assert store.load() is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_claim_someone_else_wrote_hides_no_gpu_process(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from kvwatch.boundary import proc_inspect
    from kvwatch.watchdog.host_registry import HostRegistry
    state = tmp_path / "state"
    mine = HostRegistry(str(state), "mine")
    mine.publish([])
    assert mine.flush(30)   # its writer made engines/
    me = proc_inspect.ref_of(os.getpid())
    assert me is not None
    claim = json.dumps({"name": "hog", "kvwatch": [me.pid, me.create_time], "pids": [[me.pid, me.create_time]]})
    _forge(state / "engines" / "hog.json", claim)
    assert mine.others() == frozenset()
    assert "could have been written by someone else" in caplog.text
    os.chown(state / "engines" / "hog.json", 0, -1)                  # the same claim, by kvwatch's user
    assert mine.others() == {me.pid}


def test_a_state_directory_others_may_write_is_used_with_a_warning(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o1777)
    StateStore(str(state), "e").ensure_dir()
    assert "writable by anyone (mode 1777)" in caplog.text
    assert state.stat().st_mode & 0o7777 == 0o1777   # an operator's directory: warned about, not changed
