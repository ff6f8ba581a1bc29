"""Starting and stopping the engine (and the processes recorded from an earlier one): spawn, signal, reap the group.

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
What it knows of processes it reads through kvwatch/boundary/proc_inspect.py (psutil).
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

from kvwatch.boundary.escalation import escalate
from kvwatch.boundary.proc_inspect import ProcRef, alive, create_time, group_members

_LOG = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # resolved in the parent: the child after fork only calls it


def become_subreaper(on: bool = True) -> bool:
    """Make kvwatch the child subreaper of what it spawns: a descendant of the engine whose parent
    exits (a double fork, with or without setsid) is re-parented to kvwatch, not to init, which
    proves it the engine's (kvwatch/watchdog/ownership.py). True when kvwatch is one (`on`), or
    is no longer one."""
    if _PRCTL is None:
        return False
    if is_subreaper() == on:
        return True
    return _PRCTL(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0


def is_subreaper() -> bool:
    if _PRCTL is None:
        return False
    flag = ctypes.c_int(0)
    if _PRCTL(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        return False
    return flag.value != 0


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
        self.create_time = create_time(popen.pid) or time.time()
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
    size = _enlarge_pipe(popen.stdout.fileno())  # type: ignore[union-attr]
    _LOG.debug("spawn: the engine's output pipe holds %d bytes", size)
    return EngineProcess(popen, reaper_grace)


PIPE_MAX_SIZE = "/proc/sys/fs/pipe-max-size"
_DEFAULT_PIPE_MAX = 1 << 20   # the kernel's default pipe-max-size


def _pipe_max(path: str = PIPE_MAX_SIZE) -> int:
    """The largest pipe an unprivileged process may ask for (an admin may raise it: sysctl
    fs.pipe-max-size); the kernel's default when it cannot be read."""
    try:
        with open(path, "rb") as f:   # a /proc file: never a FIFO, one short line
            value = int(f.read(64).strip() or 0)
    except (OSError, ValueError):
        return _DEFAULT_PIPE_MAX
    return value if value >= 4096 else _DEFAULT_PIPE_MAX


def _enlarge_pipe(fd: int, pipe_max: str = PIPE_MAX_SIZE) -> int:
    """Size the engine's output pipe to the most the kernel allows (best effort) and return its size.
    The engine blocks on its next write when the pipe is full: while the output pump batches its
    reads, and for as long as kvwatch itself is stopped (SIGSTOP, a debugger, a frozen cgroup), a
    larger pipe is that much more log before the engine waits (1 MiB: some 20 s at 50 KB/s)."""
    for size in dict.fromkeys((_pipe_max(pipe_max), _DEFAULT_PIPE_MAX)):
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
            break
        except (OSError, AttributeError) as exc:   # over this user's pipe pages (EPERM), not Linux
            _LOG.debug("pipe: cannot be %d bytes: %s", size, exc)
    try:
        return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
    except (OSError, AttributeError):
        return 0   # not Linux: the size is the platform's


# -- stopping ---------------------------------------------------------------------

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


def stop_each(refs: list[ProcRef], timeout: float, sleep: Callable[[float], None] = time.sleep) -> None:
    """End processes one by one (never a group: the caller proved each one the engine's; a group
    may hold what it did not): SIGTERM, SIGKILL after `timeout`. A reused pid (another start time)
    is never signalled."""
    def send(sig: int) -> None:
        for ref in refs:
            if alive(ref) is not None:
                _signal_pid(ref.pid, sig)

    escalate(send, lambda: [r for r in refs if alive(r) is not None], timeout, kill_wait=timeout, sleep=sleep)
