"""The engine's memory cgroup, read from /proc and the cgroup filesystem: its OOM-kill count (the
kernel's record of who killed the engine), its memory limit, and the host's memory.

Read the count before a launch (kvwatch's own cgroup: the engine is spawned into it) and again, on
the same `MemoryCgroup`, once the engine is dead; `kvwatch/watchdog/kill_cause.py` compares them.
The memory controller is found as the kernel lists it: the process's line in /proc/PID/cgroup
(cgroup v1's "N:memory:/path" wins over v2's "0::/path", as on a hybrid host, where the memory
controller is v1's) and the mount of that hierarchy in /proc/self/mountinfo, whose root field maps
the path (a v1 container sees its own cgroup mounted as the root). Every path is under `root`, so
tests read a fake tree. Nothing here raises: what cannot be read is None.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvwatch.boundary.bounded_read import read_kernel_file
from kvwatch.values.host_memory import HostMemory, OomCount

_MAX_READ = 8 << 20        # mountinfo on a busy Kubernetes node runs to a few hundred KB
_UNLIMITED = 1 << 62       # v1 writes "no limit" as LONG_MAX rounded down to a page


def _read(path: Path) -> str | None:
    return read_kernel_file(path, _MAX_READ)


@dataclass(frozen=True)
class MemoryCgroup:
    path: str          # as /proc/PID/cgroup names it, e.g. "/system.slice/kvwatch.service"
    version: int       # 1 or 2
    directory: Path    # its files (under `root`)
    mount: Path        # the mount point it lies under: walks up stop there


@dataclass(frozen=True)
class _Mount:
    root: str          # the path of the hierarchy mounted here (mountinfo field 4)
    point: str         # where it is mounted (field 5)
    fstype: str
    options: frozenset[str]  # super options: a v1 mount's controllers



def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as \\ooo."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts(text: str) -> list[_Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        mounts.append(_Mount(_unescape(fields[3]), _unescape(fields[4]), tail[0], frozenset(tail[2].split(","))))
    return mounts


def _membership(text: str) -> tuple[int, str] | None:
    """(version, path) of the memory controller's line in /proc/PID/cgroup."""
    unified = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            return 1, path
        if hierarchy == "0" and controllers == "":
            unified = path
    return (2, unified) if unified is not None else None


def _under(path: str, mount_root: str) -> str | None:
    """`path` relative to a mount's root, None when it lies outside it."""
    base = mount_root.rstrip("/")
    if path == mount_root or path.rstrip("/") == base:
        return ""
    if path.startswith(base + "/"):
        return path[len(base) + 1:]
    return None


def memory_cgroup(pid: int | str = "self", root: Path | str = "/") -> MemoryCgroup | None:
    """The memory cgroup of `pid` (kvwatch's own by default), None without one."""
    base = Path(root)
    text = _read(base / "proc" / str(pid) / "cgroup")
    mountinfo = _read(base / "proc" / "self" / "mountinfo")
    found = _membership(text) if text is not None else None
    if found is None or mountinfo is None:
        return None
    version, path = found
    for mount in _mounts(mountinfo):
        wanted = mount.fstype == "cgroup2" if version == 2 else (
            mount.fstype == "cgroup" and "memory" in mount.options)
        rel = _under(path, mount.root) if wanted else None
        if rel is None:
            continue
        top = base / mount.point.lstrip("/")
        directory = top / rel if rel else top
        if directory.is_dir():
            return MemoryCgroup(path, version, directory, top)
    return None


def _keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def _upwards(cgroup: MemoryCgroup) -> list[tuple[Path, str]]:
    """The cgroup's directory and its parents' up to the mount, each with its cgroup path."""
    out, directory, path = [], cgroup.directory, cgroup.path
    while True:
        out.append((directory, path))
        if directory == cgroup.mount or cgroup.mount not in directory.parents:
            return out
        directory, path = directory.parent, path.rstrip("/").rsplit("/", 1)[0] or "/"


def read_oom_count(cgroup: MemoryCgroup | None) -> OomCount | None:
    """The cgroup's OOM-kill count now; None without a cgroup or a counter to read (v1 before 4.13,
    the v2 root). On v2 the nearest cgroup up that accounts memory is read: its count includes ours."""
    if cgroup is None:
        return None
    if cgroup.version == 1:
        text = _read(cgroup.directory / "memory.oom_control")
        counts = _keyed(text) if text is not None else {}
        return OomCount(cgroup.path, 1, counts["oom_kill"]) if "oom_kill" in counts else None
    for directory, path in _upwards(cgroup):
        text = _read(directory / "memory.events")
        if text is None:
            continue
        counts = _keyed(text)
        if "oom_kill" in counts:
            return OomCount(path, 2, counts["oom_kill"], counts.get("oom_group_kill"))
    return None


def _limit(text: str | None) -> int | None:
    value = (text or "").strip()
    return int(value) if value.isdigit() and int(value) < _UNLIMITED else None


def host_memory(cgroup: MemoryCgroup | None, root: Path | str = "/") -> HostMemory:
    """MemTotal, and the tightest memory limit on the cgroup and its parents (v2 memory.max, v1
    memory.limit_in_bytes) up to the mount: what the engine can have at most."""
    meminfo = _read(Path(root) / "proc" / "meminfo")
    total = None
    for line in (meminfo or "").splitlines():
        if line.startswith("MemTotal:"):
            words = line.split()
            total = int(words[1]) * 1024 if len(words) >= 2 and words[1].isdigit() else None
    if cgroup is None:
        return HostMemory(total, None, None)
    name = "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"
    limits = [v for d, _ in _upwards(cgroup) if (v := _limit(_read(d / name))) is not None]
    return HostMemory(total, min(limits) if limits else None, cgroup.path)
