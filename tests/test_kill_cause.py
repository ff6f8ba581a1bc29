"""Who ended the engine, from the cgroup's OOM-kill count before and after (kvwatch/watchdog/kill_cause.py):
a table of counts x signal x exit code, and the host-memory line of a give-up."""
from __future__ import annotations

import pytest

from kvwatch.values.host_memory import HostMemory, OomCount
from kvwatch.watchdog.kill_cause import Killer, kernel_record, kill_cause, split_returncode
from kvwatch.watchdog.outcomes import KernelRecord

SVC = "/system.slice/kvwatch.service"
GIB = 1 << 30


def v2(n: int, group: int | None = 0, cgroup: str = SVC) -> OomCount:
    return OomCount(cgroup, 2, n, group)


@pytest.mark.parametrize(("before", "after", "signal", "code", "killer", "text"), [
    # the count moved and the root died of SIGKILL: the OOM killer
    (v2(0), v2(1), 9, None, Killer.OOM_KILLER,
     f"killed by the kernel's OOM killer (cgroup {SVC}, oom_kill 0→1)"),
    (OomCount("/docker/abc", 1, 4), OomCount("/docker/abc", 1, 5), 9, None, Killer.OOM_KILLER,
     "killed by the kernel's OOM killer (cgroup /docker/abc, oom_kill 4→5)"),
    (v2(0, 2), v2(3, 3), 9, None, Killer.OOM_KILLER,
     f"killed by the kernel's OOM killer (cgroup {SVC}, oom_kill 0→3, oom_group_kill 2→3)"),
    # a worker was OOM-killed and the API server exited on its own: still the OOM killer
    (v2(2), v2(3), None, 1, Killer.OOM_KILLER,
     f"exited with code 1; a process of the engine was killed by the kernel's OOM killer (cgroup {SVC}, "
     "oom_kill 2→3)"),
    (v2(0), v2(1), 15, None, Killer.OOM_KILLER,
     f"killed by signal 15 from outside; a process of the engine was killed by the kernel's OOM killer "
     f"(cgroup {SVC}, oom_kill 0→1)"),
    # the count did not move: a signal from outside
    (v2(1), v2(1), 9, None, Killer.SIGNAL,
     f"killed by signal 9 from outside (SIGKILL; not the kernel's OOM killer: cgroup {SVC} oom_kill stayed 1)"),
    (v2(0), v2(0), 2, None, Killer.SIGNAL,
     f"killed by signal 2 from outside (SIGINT; not the kernel's OOM killer: cgroup {SVC} oom_kill stayed 0)"),
    # a shell between kvwatch and the engine reports SIGKILL as 137
    (v2(0), v2(0), None, 137, Killer.SIGNAL,
     f"killed by signal 9 (exit code 137) from outside (SIGKILL; not the kernel's OOM killer: cgroup {SVC} "
     "oom_kill stayed 0)"),
    (v2(0), v2(1), None, 137, Killer.OOM_KILLER,
     f"killed by the kernel's OOM killer (cgroup {SVC}, oom_kill 0→1)"),
    # no count to compare: no cgroup, one read missing, another cgroup, a count gone backwards
    (None, None, 9, None, Killer.SIGNAL,
     "killed by signal 9 from outside (SIGKILL; no cgroup OOM-kill count to tell whether it was the kernel's "
     "OOM killer)"),
    (v2(0), None, 9, None, Killer.SIGNAL,
     "killed by signal 9 from outside (SIGKILL; no cgroup OOM-kill count to tell whether it was the kernel's "
     "OOM killer)"),
    (v2(0), v2(1, cgroup="/other"), 9, None, Killer.SIGNAL,
     "killed by signal 9 from outside (SIGKILL; no cgroup OOM-kill count to tell whether it was the kernel's "
     "OOM killer)"),
    (v2(5), v2(1), 9, None, Killer.SIGNAL,
     "killed by signal 9 from outside (SIGKILL; no cgroup OOM-kill count to tell whether it was the kernel's "
     "OOM killer)"),
    (OomCount(SVC, 1, 0), v2(1), 9, None, Killer.SIGNAL,
     "killed by signal 9 from outside (SIGKILL; no cgroup OOM-kill count to tell whether it was the kernel's "
     "OOM killer)"),
    (None, None, 40, None, Killer.SIGNAL,
     "killed by signal 40 from outside (signal 40; no cgroup OOM-kill count to tell whether it was the "
     "kernel's OOM killer)"),
    # an exit with a code and no OOM kill: nobody killed it
    (v2(0), v2(0), None, 1, Killer.NONE, "exited with code 1"),
    (None, None, None, 255, Killer.NONE, "exited with code 255"),
    (None, None, None, None, Killer.NONE, "ended, how unknown"),
])
def test_who_ended_the_engine(before: OomCount | None, after: OomCount | None, signal: int | None,
                              code: int | None, killer: Killer, text: str) -> None:
    cause = kill_cause(before, after, signal, code)
    assert (cause.killer, cause.text) == (killer, text)


def test_the_cause_carries_the_signal_and_the_counts() -> None:
    cause = kill_cause(v2(3), v2(4), None, 137)
    assert (cause.signal, cause.oom_kills) == (9, (3, 4))
    assert kill_cause(None, v2(0), 9, None).oom_kills is None
    assert kill_cause(v2(0), v2(0), None, 0).signal is None


@pytest.mark.parametrize(("returncode", "split"), [(-9, (9, None)), (-15, (15, None)), (0, (None, 0)),
                                                  (78, (None, 78)), (137, (None, 137))])
def test_split_returncode(returncode: int, split: tuple[int | None, int | None]) -> None:
    assert split_returncode(returncode) == split


@pytest.mark.parametrize(("memory", "text"), [
    (HostMemory(128 * GIB, 64 * GIB, SVC), f"host memory: 128.0 GiB, cgroup limit 64.0 GiB (cgroup {SVC})"),
    (HostMemory(int(62.5 * GIB), None, SVC), "host memory: 62.5 GiB, cgroup limit none"),
    (HostMemory(16 * GIB, 32 * GIB, "/"), "host memory: 16.0 GiB, cgroup limit none"),  # above the host: none
    (HostMemory(16 * GIB, 16 * GIB, "/"), "host memory: 16.0 GiB, cgroup limit none"),
    (HostMemory(None, 8 * GIB, "/k"), "host memory: unknown, cgroup limit 8.0 GiB (cgroup /k)"),
    (HostMemory(None, None, None), "host memory: unknown, cgroup limit none"),
])
def test_the_host_memory_line(memory: HostMemory, text: str) -> None:
    assert memory.text() == text


@pytest.mark.parametrize(("memory", "effective"), [
    (HostMemory(128 * GIB, 64 * GIB, SVC), 64 * GIB), (HostMemory(16 * GIB, 32 * GIB, "/"), 16 * GIB),
    (HostMemory(None, 8 * GIB, "/k"), 8 * GIB), (HostMemory(16 * GIB, None, None), 16 * GIB),
    (HostMemory(None, None, None), None),
])
def test_what_the_engine_can_have_at_most(memory: HostMemory, effective: int | None) -> None:
    assert memory.effective_bytes() == effective


HOST = HostMemory(128 * GIB, 64 * GIB, SVC)


@pytest.mark.parametrize(("before", "after", "host", "record"), [
    (v2(0), v2(2), HOST, KernelRecord(2, f"cgroup {SVC}, oom_kill 0→2", 64 * GIB,
                                      f"128.0 GiB, cgroup limit 64.0 GiB (cgroup {SVC})")),
    (v2(1), v2(1), HOST, KernelRecord(0, f"cgroup {SVC}, oom_kill 1→1", 64 * GIB,
                                      f"128.0 GiB, cgroup limit 64.0 GiB (cgroup {SVC})")),
    (v2(0), v2(2), None, KernelRecord(2, f"cgroup {SVC}, oom_kill 0→2")),
    (None, v2(2), HOST, KernelRecord(0, "", 64 * GIB, f"128.0 GiB, cgroup limit 64.0 GiB (cgroup {SVC})")),
    (v2(3), v2(1), None, KernelRecord()),                     # the cgroup was made again: no count
    (v2(0), v2(1, cgroup="/other"), None, KernelRecord()),
])
def test_the_recovery_kernel_record(before: OomCount | None, after: OomCount | None, host: HostMemory | None,
                                    record: KernelRecord) -> None:
    assert kernel_record(before, after, host) == record
