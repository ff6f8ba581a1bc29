"""The state file (kvwatch/watchdog/state_store.py): atomic, corrupt files moved aside, one lock."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from kvwatch.errors import KvwatchError
from kvwatch.watchdog.state_store import EngineLock, EngineRecord, StateStore


def test_state_file_atomic_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "e")
    store.ensure_dir()
    record = EngineRecord(name="e", original_argv=["a"], argv=["a", "--block-size", "32"],
                          learned_non_kv={"3f2a": 123}, pids=[{"pid": 1, "create_time": 2.0, "name": "x"}])
    store.save(record)
    store.save(record)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json"]  # no temp file left behind
    loaded = store.load()
    assert loaded is not None and loaded.argv == record.argv and loaded.learned_non_kv == {"3f2a": 123}
    assert oct(os.stat(tmp_path / "e.json").st_mode & 0o777) == "0o640"


def test_the_memory_parts_are_kept_and_a_file_from_before_them_loads(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "e")
    store.ensure_dir()
    parts = {"weights": 15_299_532_501, "kv_cache": 26_661_009_489, "cuda_graphs": 536_870_912}
    store.save(EngineRecord(name="e", argv=["a"], log_memory_parts=parts))
    loaded = store.load()
    assert loaded is not None and loaded.log_memory_parts == parts
    # A state file written before the field existed: the same record, no parts, nothing moved aside.
    data = json.loads((tmp_path / "e.json").read_text())
    del data["log_memory_parts"]
    (tmp_path / "e.json").write_text(json.dumps(data))
    older = store.load()
    assert older is not None and older.argv == ["a"] and older.log_memory_parts == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json"]
    # Parts of the wrong type are a corrupt file, as every other field's.
    data["log_memory_parts"] = {"weights": "14 GiB"}
    (tmp_path / "e.json").write_text(json.dumps(data))
    assert store.load() is None


def test_a_file_with_the_old_single_learned_figure_loads(tmp_path: Path) -> None:
    """Before learned figures were kept per profile, the record held one `non_kv_bytes`: such a file
    loads (the figure, keyed by nothing, is left behind) and nothing is moved aside."""
    store = StateStore(tmp_path, "e")
    store.ensure_dir()
    data = EngineRecord(name="e", argv=["a"]).to_json()
    data["non_kv_bytes"] = 123
    (tmp_path / "e.json").write_text(json.dumps(data))
    loaded = store.load()
    assert loaded is not None and loaded.argv == ["a"] and loaded.learned_non_kv == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json"]


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 99}', b"\xff\xfe", b'{"version": 1, "name": 5}',
                                     b'{"version": 1, "name": "e", "constraints": [7]}',
                                     b'{"version": 1, "name": "e", "constraints": [{"backend_block_sizes": ["32"]}]}'])
def test_corrupt_state_file_is_moved_aside(tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "e.json").write_bytes(content)
    store = StateStore(tmp_path, "e")
    with caplog.at_level(logging.WARNING):
        assert store.load() is None
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("e.json.corrupt-")]
    assert len(aside) == 1 and not (tmp_path / "e.json").exists()
    assert "moved aside" in caplog.text
    store.save(EngineRecord(name="e"))
    assert store.load() is not None


def test_engine_lock_is_exclusive(tmp_path: Path) -> None:
    first, second = EngineLock(tmp_path, "e"), EngineLock(tmp_path, "e")
    first.acquire()
    with pytest.raises(KvwatchError, match=f"pid {os.getpid()}"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()
