"""The host's memory now: MemAvailable and MemTotal from /proc/meminfo, the memory pressure (PSI) from
/proc/pressure/memory, and the kernel's boot id (a stop recorded under another boot id was followed by
a reboot). Every path is under `root`, so tests read a fake tree. Nothing here raises: a kernel without
PSI (CONFIG_PSI off, or psi=0, where the read fails) reports None.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from kvwatch.boundary.bounded_read import read_kernel_file
from kvwatch.values.host_memory import HostMemorySample


def _meminfo_bytes(text: str, key: str) -> int | None:
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            words = rest.split()
            if words and words[0].isdigit():
                return int(words[0]) * (1024 if words[1:2] == ["kB"] else 1)
    return None


def _avg10(text: str, kind: str) -> float | None:
    """`avg10` of the "some" or "full" line: "some avg10=1.23 avg60=0.50 avg300=0.10 total=123"."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == kind:
            for word in words[1:]:
                key, _, value = word.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def read_sample(root: Path | str = "/", clock: Callable[[], float] = time.monotonic) -> HostMemorySample:
    proc = Path(root) / "proc"
    meminfo = read_kernel_file(proc / "meminfo") or ""
    pressure = read_kernel_file(proc / "pressure" / "memory") or ""
    return HostMemorySample(clock(), _meminfo_bytes(meminfo, "MemAvailable"), _meminfo_bytes(meminfo, "MemTotal"),
                            _avg10(pressure, "some"), _avg10(pressure, "full"))


def boot_id(root: Path | str = "/") -> str:
    """This boot's id ("" when it cannot be read)."""
    return (read_kernel_file(Path(root) / "proc" / "sys" / "kernel" / "random" / "boot_id") or "").strip()
