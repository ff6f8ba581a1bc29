"""Whether the kernel's OOM killer ended the engine: the cgroup's OOM-kill count read before the launch
and after the death, as the recovery's KernelRecord (pure).

The count is the kernel's own record (cgroup v2 ``memory.events`` ``oom_kill``, v1
``memory.oom_control`` ``oom_kill``; ``kvwatch/boundary/oom_record.py`` reads it). It counts every
OOM kill of a process in the cgroup, the host-wide OOM killer's too, so a count that moved during the
launch names the OOM killer even when the process that died of it was one of the engine's workers and
the API server exited with a code of its own. A count that did not move, or none to read, leaves the
signal to name the end (watchdog/recovery.py).
"""
from __future__ import annotations

from kvwatch.values.host_memory import HostMemory, OomCount
from kvwatch.watchdog.outcomes import KernelRecord


def _comparable(before: OomCount | None, after: OomCount | None) -> tuple[int, int] | None:
    """Both reads of the same cgroup, the count not gone backwards (a cgroup removed and made again)."""
    if before is None or after is None:
        return None
    if (before.cgroup, before.version) != (after.cgroup, after.version) or after.oom_kill < before.oom_kill:
        return None
    return before.oom_kill, after.oom_kill


def kernel_record(before: OomCount | None, after: OomCount | None, host: HostMemory | None) -> KernelRecord:
    """The recovery's KernelRecord (outcomes.py) from the counts read before and after a launch and the
    host's memory: the OOM kills counted during the launch (0 when the reads do not compare)."""
    counts = _comparable(before, after)
    kills, where = 0, ""
    if counts is not None and after is not None:
        kills = counts[1] - counts[0]
        where = f"cgroup {after.cgroup}, oom_kill {counts[0]}→{counts[1]}"
    if host is None:
        return KernelRecord(kills, where)
    return KernelRecord(kills, where, host.effective_bytes(), host.words())
