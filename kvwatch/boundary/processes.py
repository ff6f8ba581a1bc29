"""The process boundary: the only kvwatch module that spawns or signals processes or imports psutil.

The engine runs in its own session and process group, so one killpg reaches the API
server, EngineCore, the Workers and the resource tracker. Two guards make sure it does
not outlive kvwatch:
- a parent-death signal (PR_SET_PDEATHSIG) on the API server, for the instant between
  spawn and the reaper's start;
- a reaper process per engine (kvwatch/watchdog/reaper.py) that ends the whole group when
  kvwatch dies, kill -9 included, because pdeathsig alone leaves EngineCore and the
  Workers running (docs/vllm-facts.md §9).
PR_SET_PDEATHSIG fires when the spawning *thread* exits: spawn from a thread that
lives as long as the engine (the supervisor's loop).
"""
from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from kvwatch.boundary.escalation import escalate

_LOG = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
_CT_TOLERANCE = 0.05  # seconds: psutil's create_time of one process is stable to the tick


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


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # resolved in the parent: the child after fork only calls it


def _child_setup(parent_pid: int, sig: int) -> Callable[[], None]:
    def setup() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        # The parent may have died before prctl: then the signal never comes. Exit now.
        if os.getppid() != parent_pid:
            os._exit(1)
    return setup


class EngineProcess:
    """A spawned engine: the Popen (stdout+stderr on one pipe), its group and its reaper."""

    def __init__(self, popen: subprocess.Popen[bytes], reaper_grace: float) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.pgid = popen.pid  # start_new_session: the leader's pid is the group id
        self.create_time = _create_time(popen.pid) or time.time()
        self._reaper_grace = reaper_grace
        self._reaper: subprocess.Popen[bytes] | None = None
        self._reaper_pipe: int | None = None
        self.start_reaper()

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from a waiter thread) as soon as the engine's main process exits:
        the watch loop then reacts at once instead of at its next tick."""
        def wait() -> None:
            self.popen.wait()
            callback()
        threading.Thread(target=wait, name=f"exit-waiter-{self.pid}", daemon=True).start()

    @property
    def stdout(self) -> int:
        assert self.popen.stdout is not None
        return self.popen.stdout.fileno()

    def poll(self) -> int | None:
        return self.popen.poll()

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def start_reaper(self) -> None:
        """(Re)start the reaper; kvwatch keeps the pipe's only write end."""
        self._close_reaper(done=True)
        read_end, write_end = os.pipe()  # both non-inheritable: the engine never holds them
        try:
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "kvwatch.watchdog.reaper", str(self.pgid), str(self._reaper_grace)],
                stdin=read_end, stdout=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "PYTHONPATH": _package_root()})
        except OSError as exc:
            os.close(write_end)
            _LOG.warning("reaper: cannot start (%s): the engine may outlive a killed kvwatch", exc)
            return
        finally:
            os.close(read_end)
        self._reaper_pipe = write_end

    @property
    def own_pids(self) -> frozenset[int]:
        """The children kvwatch waits for itself (Popen objects): never reaped by reap_orphans()."""
        return frozenset(p.pid for p in (self.popen, self._reaper) if p is not None)

    def reaper_alive(self) -> bool:
        return self._reaper is not None and self._reaper.poll() is None

    def release_reaper(self) -> None:
        """The engine is stopped on purpose: tell the reaper to exit without signalling."""
        self._close_reaper(done=True)

    def _close_reaper(self, done: bool) -> None:
        if self._reaper_pipe is not None:
            if done:
                try:
                    os.write(self._reaper_pipe, b"done")
                except OSError:
                    pass  # the reaper is gone already
            os.close(self._reaper_pipe)
            self._reaper_pipe = None
        if self._reaper is not None:
            try:
                self._reaper.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
            self._reaper = None

    def close(self) -> None:
        self.release_reaper()
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def _package_root() -> str:
    """The directory holding the kvwatch package, so the reaper imports this same kvwatch."""
    import kvwatch
    here = os.path.dirname(os.path.dirname(os.path.abspath(kvwatch.__file__)))
    existing = os.environ.get("PYTHONPATH")
    return here + (os.pathsep + existing if existing else "")


def spawn(argv: Sequence[str], env: Mapping[str, str], *, cwd: str | None = None,
          reaper_grace: float = 5.0, pdeathsig: int = signal.SIGTERM) -> EngineProcess:
    """Start the engine in its own session; stdout and stderr share one pipe (order kept)."""
    popen = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(env), cwd=cwd, start_new_session=True, close_fds=True,
        preexec_fn=_child_setup(os.getpid(), pdeathsig))
    _enlarge_pipe(popen.stdout.fileno())  # type: ignore[union-attr]
    return EngineProcess(popen, reaper_grace)


_PIPE_BYTES = 1 << 20  # Linux's default pipe-max-size: allowed without privileges


def _enlarge_pipe(fd: int) -> None:
    """A 1 MiB pipe instead of 64 KiB: the engine's bursts (a traceback, a flood of request
    lines) fit while the output pump batches its reads, so the engine does not wait on it."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (OSError, AttributeError) as exc:  # a lower pipe-max-size, or not Linux: keep 64 KiB
        _LOG.debug("pipe stays at its default size: %s", exc)


# -- looking at processes ---------------------------------------------------------

def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _info(proc: psutil.Process) -> ProcInfo | None:
    try:
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            try:
                rss = proc.memory_info().rss
            except psutil.AccessDenied:
                rss = None
            try:
                cmdline = tuple(proc.cmdline())
            except psutil.AccessDenied:
                cmdline = ()
            try:
                pgid: int | None = os.getpgid(proc.pid)
            except OSError:
                pgid = None
            return ProcInfo(proc.pid, proc.ppid(), pgid, proc.name(), proc.create_time(), rss, cmdline)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
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


# -- signalling -----------------------------------------------------------------

def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        _LOG.warning("signal: no permission to signal process group %d", pgid)
        return False


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(pgid: int, timeout: float, *, leader: subprocess.Popen[bytes] | None = None,
               extra: Iterable[ProcRef] = (), poll: float = 0.1,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> bool:
    """SIGTERM (and SIGCONT, so a stopped group can act on it) to the group and to `extra`
    processes; SIGKILL after `timeout`. True when nothing is left. Reaps `leader`."""
    extra = list(extra)

    def remaining() -> list[int]:
        if leader is not None:
            leader.poll()  # reap our child, else it stays a zombie member of the group
        left = [p.pid for p in group_members(pgid)]
        left += [r.pid for r in extra if alive(r) is not None and r.pid not in left]
        return left

    def send(sig: int) -> None:
        _signal_group(pgid, sig)
        for ref in extra:
            if alive(ref) is not None:
                _signal_pid(ref.pid, sig)

    def before_kill() -> None:
        _LOG.warning("stop: group %d still has %s after %.0fs: SIGKILL", pgid, remaining(), timeout)

    if escalate(send, remaining, timeout, poll=poll, clock=clock, sleep=sleep, before_kill=before_kill):
        return True
    _LOG.error("stop: group %d: %s survived SIGKILL", pgid, remaining())
    return False


def kill_processes(refs: Iterable[ProcRef], timeout: float,
                   sleep: Callable[[float], None] = time.sleep, marker: tuple[str, str] | None = None) -> list[int]:
    """End recorded processes of an earlier engine, with their process groups when the group is
    provably the engine's: its leader carries the engine's `marker` (variable, value) too (else
    each process alone, never a stranger's whole group). Returns the pids that were alive."""
    live = [r for r in refs if alive(r) is not None]
    own_group = os.getpgid(0)
    by_group: dict[int, list[ProcRef]] = {}
    loose: list[ProcRef] = []
    for ref in live:
        pgid = _pgid(ref.pid)
        if pgid is None or pgid == own_group or not _leader_carries(pgid, marker):
            loose.append(ref)     # never our own group, nor one whose leader is a stranger
        else:
            by_group.setdefault(pgid, []).append(ref)
    for pgid, members in by_group.items():
        stop_group(pgid, timeout, extra=members, sleep=sleep)
    if loose:
        _stop_each(loose, timeout, sleep)
    return [r.pid for r in live]


def _leader_carries(pgid: int, marker: tuple[str, str] | None) -> bool:
    """Whether the group's leader carries the engine's marker (no marker given: trust the group)."""
    return marker is None or environ_value(pgid, marker[0]) == marker[1]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _stop_each(refs: list[ProcRef], timeout: float, sleep: Callable[[float], None] = time.sleep) -> None:
    def send(sig: int) -> None:
        for ref in refs:
            if alive(ref) is not None:
                _signal_pid(ref.pid, sig)

    escalate(send, lambda: [r for r in refs if alive(r) is not None], timeout, kill_wait=timeout, sleep=sleep)


def marked(key: str, value: str) -> list[ProcRef]:
    """Every live process whose environment has key=value (an engine's marker, inherited by every
    descendant, also one that double-forked into a session of its own)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(key) == value and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(ProcRef(proc.pid, proc.create_time()))
        except (psutil.Error, OSError):
            continue
    return found


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


def rss(pids: Iterable[int]) -> dict[int, int]:
    """pid -> resident bytes for the pids still running (the exporter's per-process series)."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return out
