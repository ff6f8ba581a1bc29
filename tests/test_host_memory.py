"""The host's memory (kvwatch/boundary/host_memory.py) from fake /proc trees, and the stop record in the
state file (records.HostMemoryStop in EngineRecord.host_memory_stops): saved before the stop, read by
the next kvwatch, old and newer files alike."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.boundary.host_memory import boot_id, read_sample
from kvwatch.values.host_memory import HostMemorySample
from kvwatch.watchdog.host_memory_watch import HostMemoryLevel, host_memory_verdict, stop_record
from kvwatch.watchdog.state_store import MAX_HOST_MEMORY_STOPS, EngineRecord, HostMemoryStop, StateStore

GIB = 1 << 30
MEMINFO = ("MemTotal:       124781432 kB\nMemFree:         1203312 kB\nMemAvailable:    3145728 kB\n"
           "Buffers:            1024 kB\nHugePages_Total:       0\n")
PSI = "some avg10=31.50 avg60=12.02 avg300=3.10 total=1234567\nfull avg10=45.25 avg60=10.00 avg300=2.00 total=99\n"
BOOT = "6d9f3c2e-1b2a-4c3d-8e4f-5a6b7c8d9e0f"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_meminfo_and_pressure(tmp_path: Path) -> None:
    root = tree(tmp_path, {"proc/meminfo": MEMINFO, "proc/pressure/memory": PSI,
                           "proc/sys/kernel/random/boot_id": BOOT + "\n"})
    assert read_sample(root, clock=lambda: 7.5) == HostMemorySample(7.5, 3 * GIB, 124781432 * 1024, 31.5, 45.25)
    assert boot_id(root) == BOOT


@pytest.mark.parametrize(("files", "sample"), [
    # no PSI (CONFIG_PSI off): MemAvailable alone
    ({"proc/meminfo": MEMINFO}, HostMemorySample(0.0, 3 * GIB, 124781432 * 1024, None, None)),
    # a kernel before 3.14: no MemAvailable
    ({"proc/meminfo": "MemTotal: 1024 kB\nMemFree: 512 kB\n", "proc/pressure/memory": PSI},
     HostMemorySample(0.0, None, 1 << 20, 31.5, 45.25)),
    # an older PSI without the full line
    ({"proc/meminfo": MEMINFO, "proc/pressure/memory": "some avg10=2.00 avg60=1.00 avg300=0.00 total=5\n"},
     HostMemorySample(0.0, 3 * GIB, 124781432 * 1024, 2.0, None)),
    ({"proc/meminfo": MEMINFO, "proc/pressure/memory": "some avg10=x total=5\nfull\n"},
     HostMemorySample(0.0, 3 * GIB, 124781432 * 1024, None, None)),
    ({}, HostMemorySample(0.0, None, None, None, None)),
], ids=["no-psi", "no-memavailable", "no-full-line", "garbled-psi", "no-proc"])
def test_what_the_kernel_does_not_report_is_none(tmp_path: Path, files: dict[str, str],
                                                 sample: HostMemorySample) -> None:
    assert read_sample(tree(tmp_path, files), clock=lambda: 0.0) == sample
    assert boot_id(tmp_path) == ""


def test_psi_disabled_at_boot_fails_the_read_and_is_none(tmp_path: Path) -> None:
    # psi=0: the file is there and reading it fails (EOPNOTSUPP); a directory stands in for a failing read
    root = tree(tmp_path, {"proc/meminfo": MEMINFO})
    (root / "proc/pressure/memory").mkdir(parents=True)
    sample = read_sample(root, clock=lambda: 0.0)
    assert (sample.some_avg10, sample.full_avg10, sample.available_bytes) == (None, None, 3 * GIB)


def test_a_stop_read_from_fake_proc_is_saved_and_read_by_the_next_kvwatch(tmp_path: Path) -> None:
    root = tree(tmp_path / "host", {"proc/meminfo": MEMINFO, "proc/pressure/memory": PSI,
                                    "proc/sys/kernel/random/boot_id": BOOT})
    verdict = host_memory_verdict([read_sample(root)] * 3)
    assert verdict.level is HostMemoryLevel.STOP
    store = StateStore(tmp_path / "state", "e")
    store.ensure_dir()
    record = EngineRecord(name="e", argv=["vllm", "serve", "m"])
    record.host_memory_stops.append(stop_record(verdict, "profiling", record.argv, 1_800_000_000.0, boot_id(root)))
    store.save(record)
    loaded = StateStore(tmp_path / "state", "e").load()   # the next start, after a reboot: a new process
    assert loaded is not None and loaded.host_memory_stops == record.host_memory_stops
    stop = loaded.host_memory_stops[0]
    assert (stop.phase, stop.available_bytes, stop.full_avg10, stop.boot_id) == ("profiling", 3 * GIB, 45.25, BOOT)


def _stop(i: int) -> HostMemoryStop:
    return HostMemoryStop(float(i), "loading", f"stop {i}", ["vllm"], 1 * GIB, 16 * GIB, 1.0, 50.0, BOOT)


def test_files_without_the_field_and_stops_from_a_newer_kvwatch_load(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "e")
    store.ensure_dir()
    data = EngineRecord(name="e", argv=["a"]).to_json()
    del data["host_memory_stops"]                          # a state file from before host memory stops
    (tmp_path / "e.json").write_text(json.dumps(data))
    older = store.load()
    assert older is not None and older.host_memory_stops == []
    data["host_memory_stops"] = [{**_stop(1).to_json(), "swap_bytes": 5, "available_bytes": None}]  # newer
    (tmp_path / "e.json").write_text(json.dumps(data))
    newer = store.load()
    assert newer is not None and newer.host_memory_stops[0].available_bytes is None
    assert newer.host_memory_stops[0].reason == "stop 1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json"]   # nothing moved aside


@pytest.mark.parametrize("bad", [{"time": "now"}, {"available_bytes": 1.5}, {"argv": "vllm"},
                                 {"full_avg10": True}, {"phase": None}])
def test_a_bad_stop_is_a_corrupt_file(tmp_path: Path, bad: dict[str, object]) -> None:
    store = StateStore(tmp_path, "e")
    store.ensure_dir()
    data = EngineRecord(name="e", argv=["a"]).to_json()
    data["host_memory_stops"] = [{**_stop(1).to_json(), **bad}]
    (tmp_path / "e.json").write_text(json.dumps(data))
    assert store.load() is None


def test_only_the_newest_stops_are_kept(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "e")
    store.ensure_dir()
    store.save(EngineRecord(name="e", argv=["a"], host_memory_stops=[_stop(i) for i in range(30)]))
    loaded = store.load()
    assert loaded is not None
    assert [s.reason for s in loaded.host_memory_stops] == [f"stop {i}" for i in range(30 - MAX_HOST_MEMORY_STOPS, 30)]
