"""What the host and the engine's cgroup say of memory, as values (pure): the boundary reads them
(boundary/oom_record.py, boundary/host_memory.py), the watchdog judges them (watchdog/kill_cause.py,
watchdog/host_memory_watch.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OomCount:
    """One read of a memory cgroup's OOM-kill counters."""

    cgroup: str                       # the cgroup as /proc/PID/cgroup names it ("/system.slice/x.service")
    version: int                      # 1 or 2
    oom_kill: int                     # processes of the cgroup the OOM killer killed (v2: its children too)
    oom_group_kill: int | None = None  # v2, kernel 5.17+: whole-group kills (memory.oom.group)


@dataclass(frozen=True)
class HostMemory:
    """What a give-up for host memory says the host has."""

    total_bytes: int | None          # MemTotal; None: not read
    cgroup_limit_bytes: int | None   # the tightest limit on the engine's cgroup and its parents; None: none
    cgroup: str | None = None        # the engine's memory cgroup, as /proc/PID/cgroup names it

    def effective_bytes(self) -> int | None:
        """What the engine can have at most: the host's memory, or the cgroup's limit where lower."""
        known = [n for n in (self.total_bytes, self.cgroup_limit_bytes) if n is not None]
        return min(known) if known else None

    def words(self) -> str:
        """"X GiB, cgroup limit Y": a limit at or above the host's memory is none."""
        total = _gib(self.total_bytes) if self.total_bytes is not None else "unknown"
        limit = self.cgroup_limit_bytes
        if limit is None or (self.total_bytes is not None and limit >= self.total_bytes):
            return f"{total}, cgroup limit none"
        where = f" (cgroup {self.cgroup})" if self.cgroup else ""
        return f"{total}, cgroup limit {_gib(limit)}{where}"

    def text(self) -> str:
        return f"host memory: {self.words()}"


@dataclass(frozen=True)
class HostMemorySample:
    """One read of /proc/meminfo and /proc/pressure/memory; None: not reported (an old kernel, no PSI)."""

    time: float                          # monotonic seconds
    available_bytes: int | None          # MemAvailable
    total_bytes: int | None              # MemTotal
    some_avg10: float | None = None      # % of the last 10 s some task stalled on memory
    full_avg10: float | None = None      # % of the last 10 s every non-idle task stalled on memory


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"
