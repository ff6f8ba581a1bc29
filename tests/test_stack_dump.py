"""Collecting a stalled engine's stacks (kvwatch/boundary/stack_dump.py): vLLM's own dump files, py-spy
(a stand-in executable for its failures and its silence; the real one where installed), both bounded."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvwatch.boundary.stack_dump import MAX_DUMP_BYTES, collect, py_spy_dump, vllm_dump_dir, vllm_dumps
from kvwatch.diagnosis.stall_stacks import NCCL, SHM_BROADCAST, parse_stacks, where_stuck
from kvwatch.planner.engine_args import EngineCommand

V = "/usr/lib/python3.12/site-packages/vllm"
CORE_WAITS = (f'Thread 0x00007f3c00001000 (most recent call first):\n'
              f'  File "{V}/distributed/device_communicators/shm_broadcast.py", line 897 in acquire_read\n'
              f'  File "{V}/v1/executor/multiproc_executor.py", line 520 in collective_rpc\n')
CORE_IDLE = ('Thread 0x00007f3c00001000 (most recent call first):\n'
             f'  File "{V}/v1/engine/core.py", line 1663 in _process_input_queue\n')


def _dump(n: int, why: str, body: str) -> str:
    return f"\n>>> Call stack dump #{n} at Sun Dec  6 21:00:00 2026 due to {why}\n\n{body}\n" + "=" * 64 + "\n"


@pytest.mark.parametrize("argv, expected", [
    (["vllm", "serve", "m", "--watchdog-config", '{"dump_dir": "/var/tmp/dumps", "timeout": 60}'], "/var/tmp/dumps"),
    (["vllm", "serve", "m", "--watchdog-config.dump_dir", "/d"], "/d"),
    (["vllm", "serve", "m", "--watchdog-config.dump_dir=/e"], "/e"),
    (["vllm", "serve", "m", "--watchdog-config", '{"timeout": 60}'], None),
    (["vllm", "serve", "m", "--watchdog-config", "not json"], None),
    (["vllm", "serve", "m"], None),
])
def test_the_dump_dir_is_read_from_the_command(argv: list[str], expected: str | None) -> None:
    assert vllm_dump_dir(EngineCommand(tuple(argv), "0.33.0")) == expected


def test_the_last_dump_of_each_engine_pid_is_read_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "VLLM_STACK_DUMP_for_engine_0_300.log").write_text(
        _dump(1, "feed timeout", CORE_IDLE) + _dump(2, "SIGTERM", CORE_WAITS))
    (tmp_path / "VLLM_STACK_DUMP_for_worker_0_999.log").write_text(_dump(1, "shutdown", CORE_IDLE))  # not ours
    os.mkfifo(tmp_path / "VLLM_STACK_DUMP_for_worker_1_301.log")                                    # never waited on
    (tmp_path / "other.log").write_text(CORE_WAITS)
    dumps = vllm_dumps(str(tmp_path), [300, 301])
    assert [(d.process, d.source) for d in dumps] == [("engine_0 pid 300", "vllm"), ("worker_1 pid 301", "vllm")]
    assert dumps[0].text.startswith(">>> Call stack dump #2") and "due to SIGTERM" in dumps[0].text
    assert dumps[1].text == "" and "not a regular file (a FIFO)" in (dumps[1].error or "")
    stuck = where_stuck(parse_stacks(dumps[0].text, dumps[0].process))
    assert stuck is not None and stuck.place == SHM_BROADCAST and stuck.process == "engine_0 pid 300"
    assert vllm_dumps(str(tmp_path), [300], newer_than=time.time() + 60) == []   # an older dump: not this stall
    assert vllm_dumps(str(tmp_path / "missing"), [300]) == []


def test_a_huge_dump_file_is_read_from_its_end_only(tmp_path: Path) -> None:
    path = tmp_path / "VLLM_STACK_DUMP_for_engine_0_300.log"
    with open(path, "w") as f:
        f.write(_dump(1, "feed timeout", CORE_IDLE) * (3 * MAX_DUMP_BYTES // len(_dump(1, "x", CORE_IDLE))))
        f.write(_dump(99, "SIGTERM", CORE_WAITS))
    [dump] = vllm_dumps(str(tmp_path), [300])
    assert dump.text.startswith(">>> Call stack dump #99") and len(dump.text) < MAX_DUMP_BYTES


def _fake_spy(tmp_path: Path, body: str) -> str:
    spy = tmp_path / "py-spy"
    spy.write_text("#!/bin/sh\n" + body)
    spy.chmod(0o755)
    return str(spy)


SPY_OUT = ('Process 311: VLLM::Worker_TP1\nPython v3.12.3 (/usr/bin/python3.12)\n\n'
           'Thread 311 (active+gil): "MainThread"\n'
           '    all_reduce (vllm/distributed/device_communicators/pynccl.py:295)\n'
           '    forward (vllm/model_executor/models/llama.py:330)\n')


def test_py_spy_answers_fails_or_says_nothing_within_the_time_given(tmp_path: Path) -> None:
    (tmp_path / "out.txt").write_text(SPY_OUT)
    ok = py_spy_dump(311, 10, _fake_spy(tmp_path, f'[ "$1 $2 $3" = "dump --pid 311" ] && cat {tmp_path}/out.txt\n'))
    stuck = where_stuck(parse_stacks(ok.text, ok.process))
    assert ok.error is None and stuck is not None and stuck.place == NCCL
    denied = py_spy_dump(311, 10, _fake_spy(tmp_path, 'echo "Error: Permission denied (os error 13)" >&2; exit 1\n'))
    assert denied.text == "" and denied.error == "py-spy exited 1: Error: Permission denied (os error 13)"
    start = time.monotonic()
    silent = py_spy_dump(311, 0.5, _fake_spy(tmp_path, "exec sleep 30\n"))
    assert time.monotonic() - start < 5 and silent.error == "py-spy: no answer within 0.5s"


def test_collect_prefers_vllms_own_dump_and_bounds_the_rest(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "VLLM_STACK_DUMP_for_engine_0_300.log").write_text(_dump(1, "SIGTERM", CORE_WAITS))
    spy = _fake_spy(tmp_path, "exec sleep 30\n")
    start = time.monotonic()
    found = collect([300, 310, 311], 1.0, str(dumps), py_spy=spy)
    assert time.monotonic() - start < 6      # one second in all, not one per pid
    assert [(d.process, d.source) for d in found] == [("engine_0 pid 300", "vllm"), ("pid 310", "py-spy"),
                                                      ("pid 311", "py-spy")]
    assert found[0].text and all(d.error for d in found[1:])
    if shutil.which("py-spy") is None:   # and without py-spy, one line says so
        [vllm, missing] = collect([300, 310], 1.0, str(dumps))
        assert vllm.source == "vllm" and missing.error == "py-spy is not installed"


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed")
def test_the_real_py_spy_reads_a_python_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\ndef stuck_here():\n time.sleep(60)\nstuck_here()"])
    try:
        time.sleep(1.0)
        dump = py_spy_dump(child.pid, 20)
        if dump.error and "ermission" in dump.error:
            pytest.skip(f"no ptrace rights here: {dump.error}")
        stacks = parse_stacks(dump.text, dump.process)
        assert any(f.function == "stuck_here" for s in stacks for f in s.frames), dump.text
    finally:
        child.kill()
        child.wait()


def test_stall_evidence_names_the_place_and_keeps_the_stacks(tmp_path: Path) -> None:
    from kvwatch.watchdog.stall_evidence import stall_evidence
    (tmp_path / "VLLM_STACK_DUMP_for_engine_0_300.log").write_text(_dump(1, "SIGTERM", CORE_WAITS))
    (tmp_path / "out.txt").write_text(SPY_OUT)
    command = EngineCommand(("vllm", "serve", "m", "--watchdog-config", f'{{"dump_dir": "{tmp_path}"}}'), "0.33.0")
    spy = _fake_spy(tmp_path, f"cat {tmp_path}/out.txt\n")
    evidence = stall_evidence([300, 311], command, 5.0, py_spy=spy)
    assert evidence.stuck is not None and evidence.stuck.place == NCCL   # the worker in NCCL, over the waiting core
    assert evidence.summary().startswith("stuck at NCCL all_reduce") and "pid 311" in evidence.summary()
    assert "== engine_0 pid 300 (vllm) ==" in evidence.text() and "== pid 311 (py-spy) ==" in evidence.text()
    assert evidence.text(limit=100).endswith("[... cut]")
    nothing = stall_evidence([311], EngineCommand(("vllm", "serve", "m"), "0.33.0"), 1.0,
                             py_spy=_fake_spy(tmp_path, "exit 3\n"))
    assert nothing.stuck is None and nothing.summary() == "no stacks: pid 311: py-spy exited 3"
