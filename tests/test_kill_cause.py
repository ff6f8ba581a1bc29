"""Whether the kernel's OOM killer ended the engine, from the cgroup's OOM-kill count before and after
(kvwatch/watchdog/kill_cause.py), and the host-memory line of a give-up: tables."""
from __future__ import annotations

import pytest

from kvwatch.values.host_memory import HostMemory, OomCount
from kvwatch.watchdog.kill_cause import kernel_record
from kvwatch.watchdog.outcomes import KernelRecord

SVC = "/system.slice/kvwatch.service"
GIB = 1 << 30


def v2(n: int, group: int | None = 0, cgroup: str = SVC) -> OomCount:
    return OomCount(cgroup, 2, n, group)


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
    (OomCount("/docker/abc", 1, 4), OomCount("/docker/abc", 1, 5), None,   # cgroup v1's count
     KernelRecord(1, "cgroup /docker/abc, oom_kill 4→5")),
    (OomCount(SVC, 1, 0), v2(1), None, KernelRecord()),       # a v1 read and a v2 read: no count
    (v2(0), None, None, KernelRecord()),                      # the second read failed
    (None, None, None, KernelRecord()),                       # no memory cgroup at all
])
def test_the_recovery_kernel_record(before: OomCount | None, after: OomCount | None, host: HostMemory | None,
                                    record: KernelRecord) -> None:
    assert kernel_record(before, after, host) == record
