"""Reading processes, ours or anyone's, through psutil: the only kvwatch module that imports psutil.

Trees and groups of the engine's processes, whether a recorded process (pid and start time) still
runs, who listens on a port, a process's environment, resident memory, and reaping zombie
children. kvwatch/boundary/spawn.py starts and stops the engine; it reads processes through here.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import psutil

from kvwatch.boundary.bounded_read import read_kernel_file

T = TypeVar("T")

_CT_TOLERANCE = 0.05  # seconds: psutil's create_time of one process is stable to the tick
CT_TOLERANCE = _CT_TOLERANCE


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int | None
    name: str
    create_time: float
    rss_bytes: int | None
    cmdline: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "create_time": self.create_time, "name": self.name}


@dataclass(frozen=True)
class ProcRef:
    """A process as recorded in the state file: pid plus start time, so a reused pid is not ours."""

    pid: int
    create_time: float

    @staticmethod
    def from_json(data: Mapping[str, object]) -> ProcRef:
        pid, create_time = data["pid"], data["create_time"]
        if not isinstance(pid, int) or not isinstance(create_time, (int, float)):   # the state file's types
            raise TypeError(f"not a process reference: pid {pid!r}, create_time {create_time!r}")
        return ProcRef(pid, float(create_time))


def create_time(pid: int) -> float | None:
    """The process's start time (psutil's, seconds since the epoch); None when it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _readable(read: Callable[[], T], denied: T) -> T:
    """A field of a live process, or `denied` where another user's process keeps it from us."""
    try:
        return read()
    except psutil.AccessDenied:
        return denied


def _cmdline(proc: psutil.Process) -> tuple[str, ...]:
    return _readable(lambda: tuple(proc.cmdline()), tuple[str, ...]())


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _info(proc: psutil.Process) -> ProcInfo | None:
    try:
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            rss = _readable(lambda: proc.memory_info().rss, None)
            cmdline = _cmdline(proc)
            return ProcInfo(proc.pid, proc.ppid(), _pgid(proc.pid), proc.name(), proc.create_time(), rss, cmdline)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def group_members(pgid: int) -> list[ProcInfo]:
    """Live (non-zombie) processes of a process group, also those re-parented to init."""
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
        except OSError:
            continue
        info = _info(proc)
        if info is not None:
            out.append(info)
    return sorted(out, key=lambda p: (p.pid != pgid, p.create_time, p.pid))


def tree(root_pid: int, pgid: int | None = None) -> list[ProcInfo]:
    """The engine's processes, root first: the root's descendants plus its group's members."""
    found: dict[int, ProcInfo] = {}
    try:
        root = psutil.Process(root_pid)
        for proc in [root, *root.children(recursive=True)]:
            info = _info(proc)
            if info is not None:
                found[info.pid] = info
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        pass
    if pgid is not None:
        for info in group_members(pgid):
            found.setdefault(info.pid, info)
    return sorted(found.values(), key=lambda p: (p.pid != root_pid, p.create_time, p.pid))


def children_of(pid: int) -> list[ProcInfo]:
    """The live (non-zombie) direct children of `pid`."""
    try:
        kids = psutil.Process(pid).children()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []
    return [info for info in (_info(k) for k in kids) if info is not None]


def alive(ref: ProcRef) -> ProcInfo | None:
    """The recorded process if it still runs (same pid *and* start time), else None."""
    try:
        proc = psutil.Process(ref.pid)
        info = _info(proc)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    if info is None or abs(info.create_time - ref.create_time) > _CT_TOLERANCE:
        return None
    return info


def describe(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return f"pid {pid} ({proc.name()}, user {proc.username()})"
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return f"pid {pid} (gone)"
    except psutil.AccessDenied:
        return f"pid {pid} (not inspectable)"


def name_of(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return "?"


def is_local_host(host: str) -> bool:
    """Whether `host` (a name or an address from a URL) is this machine."""
    import ipaddress
    import socket

    host = host.strip("[]")
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if address.is_loopback or address.is_unspecified:
        return True
    try:
        ours = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    except OSError:
        return False
    return str(address) in ours


def listening_on(port: int) -> list[int | None]:
    """Pids with a TCP socket listening on `port` (None: a socket whose owner we cannot see)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return []
    return sorted({c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port},
                  key=lambda p: -1 if p is None else p)


def environ_value(pid: int, key: str) -> str | None:
    """One variable of a process's environment; None when unset or not readable (another user)."""
    try:
        return psutil.Process(pid).environ().get(key)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, OSError):
        return None


def running(pid: int) -> bool:
    """pid exists and is not a zombie (whoever owns it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def reap_orphans(keep: Iterable[int] = ()) -> list[int]:
    """Reap zombie children other than `keep`: what PID 1 must do (a container's init, or a PID
    namespace's), since every orphan on the node of the tree is re-parented to it: vLLM's
    EngineCore and workers outlive a killed API server. Returns the pids reaped."""
    keep = frozenset(keep)
    reaped = []
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return []
    for child in children:
        try:
            if child.pid in keep or child.status() != psutil.STATUS_ZOMBIE:
                continue
            pid, _ = os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, OSError):
            continue
        if pid:
            reaped.append(pid)
    return reaped


def running_pids() -> frozenset[int]:
    """Every pid on the host now (one listing of /proc): checking a pid against it costs nothing."""
    try:
        return frozenset(psutil.pids())
    except (psutil.Error, OSError):
        return frozenset()


def is_same(ref: ProcRef) -> bool:
    """The process `ref` names still runs: same pid and start time (cheaper than alive())."""
    try:
        return abs(psutil.Process(ref.pid).create_time() - ref.create_time) <= _CT_TOLERANCE
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def ref_of(pid: int) -> ProcRef | None:
    """The running (not zombie) process `pid` as a reference; None when there is none."""
    try:
        info = _info(psutil.Process(pid))
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return ProcRef(info.pid, info.create_time) if info is not None else None


# cpu_seconds and rss run each watch tick for every pid of the engine: they read the one /proc file
# psutil's cpu_times and memory_info read, the same fields the same way, but not through a
# psutil.Process per pid, whose constructor reads /proc/PID/stat first for the start time (twice the
# files, and a NoSuchProcess built for every pid that is gone: bench/bench_overhead.py).
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _proc_numbers(pid: int, name: str, *at: int) -> list[int] | None:
    """Fields `at` of /proc/PID/NAME as numbers (stat: counted after the command's name, which may
    hold spaces and parentheses); None when the process is gone or hidden from us."""
    text = read_kernel_file(f"/proc/{pid}/{name}", 4096)
    if text is None:
        return None
    fields = text[text.rfind(")") + 2:].split() if name == "stat" else text.split()
    try:
        return [int(fields[i]) for i in at]
    except (IndexError, ValueError):
        return None


def cpu_seconds(pids: Iterable[int]) -> float | None:
    """The CPU time (user + system) the pids still running have used; None when none could be read.
    psutil's cpu_times: /proc/PID/stat's utime and stime over the clock ticks per second."""
    total, seen = 0.0, False
    for pid in pids:
        ticks = _proc_numbers(pid, "stat", 11, 12)   # utime, stime
        if ticks is not None:
            total, seen = total + ticks[0] / _CLOCK_TICKS + ticks[1] / _CLOCK_TICKS, True
    return total if seen else None


def rss(pids: Iterable[int]) -> dict[int, int]:
    """pid -> resident bytes for the pids still running (the exporter's per-process series).
    psutil's memory_info().rss: /proc/PID/statm's second field, in pages."""
    out: dict[int, int] = {}
    for pid in pids:
        pages = _proc_numbers(pid, "statm", 1)   # resident
        if pages is not None:
            out[pid] = pages[0] * _PAGE_SIZE
    return out


@dataclass(frozen=True)
class HostProcess:
    """One process with what proves whose it is (kvwatch/watchdog/ownership.py reads these)."""

    pid: int
    ppid: int
    pgid: int | None
    sid: int | None
    uid: int | None
    create_time: float
    name: str
    cmdline: tuple[str, ...]


def _host_process(proc: psutil.Process) -> HostProcess | None:
    try:
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            cmdline = _cmdline(proc)
            try:
                sid: int | None = os.getsid(proc.pid)
            except OSError:
                sid = None
            uid = _readable(lambda: proc.uids().real, None)
            return HostProcess(proc.pid, proc.ppid(), _pgid(proc.pid), sid, uid, proc.create_time(), proc.name(),
                               cmdline)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, OSError):
        return None


def host_processes() -> list[HostProcess]:
    """Every live (non-zombie) process on the host, with its group, session, user and start time."""
    out = []
    for proc in psutil.process_iter():
        found = _host_process(proc)
        if found is not None:
            out.append(found)
    return out


def host_process(pid: int) -> HostProcess | None:
    try:
        return _host_process(psutil.Process(pid))
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def cgroup_of(pid: int) -> str | None:
    """The process's cgroup v2 path (the "0::" line of /proc/PID/cgroup); None without one."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip() or None
    except OSError:
        return None
    return None
