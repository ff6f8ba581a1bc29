"""kvwatch/watchdog/learned_store.py: the learned profiles a fleet shares. usable() as a table; files
that are not whole or not ours ignored; two processes writing the same profiles a hundred times
while a third reads leave nothing but valid files (the hosts themselves: tests/test_fleet_e2e.py)."""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from pathlib import Path

import pytest

from kvwatch.watchdog import learned_store
from kvwatch.watchdog.learned_store import Launch, SharedProfile, usable

GiB = 2**30
KEY = "0123456789abcdef"
PROFILE = SharedProfile(KEY, 0, "NVIDIA H100 80GB HBM3", 81_559 * 2**20, "0.32.0", int(72 * GiB), int(53 * GiB),
                        "node-a", 1_700_000_000.0)
LAUNCH = Launch(KEY, 0, "NVIDIA H100 80GB HBM3", 81_559 * 2**20, "0.32.0", int(79 * GiB))


@pytest.mark.parametrize("change,reason", [
    ({}, None),
    ({"card": "NVIDIA H100 PCIe"}, "measured with card 'NVIDIA H100 80GB HBM3', this launch has 'NVIDIA H100 PCIe'"),
    ({"card_memory_bytes": 80 * GiB}, "measured with card_memory_bytes"),
    ({"vllm_version": "0.31.0"}, "measured with vllm_version '0.32.0', this launch has '0.31.0'"),
    ({"key": "fedcba9876543210"}, "measured with key"),
    ({"rank": 1}, "measured with rank 0"),
    ({"free_bytes": None}, "free memory is unknown"),
    ({"free_bytes": int(71 * GiB)}, "less than the"),
    ({"free_bytes": int(72 * GiB)}, None),       # exactly the budget: vLLM starts
], ids=["same", "card", "card memory", "release", "flags", "rank", "free unknown", "GPU too full", "just fits"])
def test_usable(change: dict, reason: str | None) -> None:
    why = usable(PROFILE, dataclasses.replace(LAUNCH, **change))
    assert (why is None) if reason is None else (why is not None and reason in why)


def test_written_profile_reads_back_with_its_provenance(tmp_path: Path) -> None:
    path = learned_store.write(tmp_path / "fleet", PROFILE)
    assert path.name == f"{KEY}-rank0.json"
    assert learned_store.read(tmp_path / "fleet", KEY) == PROFILE
    data = json.loads(path.read_text())
    assert data["host"] == "node-a" and data["non_kv_bytes"] == PROFILE.requested_bytes - PROFILE.available_kv_bytes
    assert learned_store.read(tmp_path / "fleet", "fedcba9876543210") is None
    assert [p.name for p in (tmp_path / "fleet").iterdir()] == [path.name]   # no temporary file left


@pytest.mark.parametrize("content", [
    b"", b"{", b'{"schema": 1}', b"\xff\xfe", b"[]",
    json.dumps({**PROFILE.to_json(), "schema": 2}).encode(),
    json.dumps({**PROFILE.to_json(), "requested_bytes": "72G"}).encode(),
    json.dumps({**PROFILE.to_json(), "available_kv_bytes": 100 * GiB}).encode(),
    json.dumps({**PROFILE.to_json(), "written_at": float("nan")}).encode(),
    json.dumps({**PROFILE.to_json(), "key": "fedcba9876543210"}).encode(),   # another profile's file renamed
    json.dumps({**PROFILE.to_json(), "rank": 1}).encode(),
    b"[" * 50_000 + b"]" * 50_000,   # json.loads recurses: RecursionError, not ValueError
], ids=["empty", "half", "fields missing", "not utf-8", "not an object", "schema", "type", "kv above budget",
        "nan", "another key", "another rank", "nested too deep"])
def test_a_file_that_is_not_a_valid_profile_is_ignored(tmp_path: Path, content: bytes) -> None:
    (tmp_path / f"{KEY}-rank0.json").write_bytes(content)
    assert learned_store.read(tmp_path, KEY) is None


def test_a_symlink_is_not_followed(tmp_path: Path) -> None:
    real = learned_store.write(tmp_path / "elsewhere", PROFILE)
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / real.name).symlink_to(real)
    assert learned_store.read(tmp_path / "fleet", KEY) is None


def test_file_names_are_only_profile_keys() -> None:
    with pytest.raises(ValueError):
        learned_store.file_name("../../etc/passwd", 0)


KEYS = [f"{i:016x}" for i in range(4)]
WRITES = 100


def _writer(directory: str, host: str, start: multiprocessing.synchronize.Event) -> None:
    start.wait()
    for i in range(WRITES):
        key = KEYS[i % len(KEYS)]
        learned_store.write(directory, dataclasses.replace(PROFILE, key=key, host=host, available_kv_bytes=i * GiB // 4,
                                                           written_at=float(i)))


def _reader(directory: str, start: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event,
            out: multiprocessing.queues.Queue) -> None:
    """Reads every profile while the writers run: a read may find no file yet, never a broken one."""
    start.wait()
    reads = broken = 0
    while not stop.is_set():
        for key in KEYS:
            path = Path(directory) / learned_store.file_name(key, 0)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            reads += 1
            try:
                SharedProfile.from_json(json.loads(data))
            except ValueError:
                broken += 1
    out.put((reads, broken))


def test_a_hundred_concurrent_writes_from_two_hosts_leave_every_file_valid(tmp_path: Path) -> None:
    directory = str(tmp_path / "fleet")
    os.makedirs(directory)
    ctx = multiprocessing.get_context("spawn")
    start, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(directory, host, start)) for host in ("node-a", "node-b")]
    reader = ctx.Process(target=_reader, args=(directory, start, stop, out))
    for p in (*writers, reader):
        p.start()
    start.set()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    stop.set()
    reads, broken = out.get(timeout=60)
    reader.join(60)
    assert broken == 0 and reads > 0
    names = sorted(os.listdir(directory))
    assert names == sorted(learned_store.file_name(k, 0) for k in KEYS)   # no temporary file left behind
    for key in KEYS:
        profile = learned_store.read(directory, key)
        assert profile is not None and profile.host in ("node-a", "node-b")
        # the last writer's figures, whole: one write's available_kv_bytes with that write's written_at
        assert profile.available_kv_bytes == int(profile.written_at) * GiB // 4
