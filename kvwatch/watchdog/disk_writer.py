"""kvwatch's files written off the decision path.

The watchdog must never wait on its disk: a hung network volume or a frozen filesystem blocks a
write for as long as it lasts, and a full or read-only one fails it. So the supervisor and the
host registry hand the newest content of each file to one writer thread and go on: a newer
content replaces one not yet written (never a queue that grows), a failed write is said once and
retried every RETRY_SECONDS, and what is in memory stays the truth meanwhile (readiness and
/metrics come from memory, never from these files).

A thread stuck in a frozen filesystem cannot be ended by anyone (the kernel does not interrupt
that write), so at exit kvwatch waits for the writer only a bounded time; the last content may
then be lost, which the state file's readers tolerate (it is rewritten at the next start).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvwatch.watchdog.write_helper import HelperProcess

_LOG = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
_REMOVE = None   # the content that means "remove the file"


class DiskWriter:
    def __init__(self, write: Callable[[Path, bytes], None], remove: Callable[[Path], None] = os.unlink,
                 clock: Callable[[], float] = time.monotonic, retry_seconds: float = RETRY_SECONDS) -> None:
        self._write, self._remove, self._clock, self._retry = write, remove, clock, retry_seconds
        self._pending: dict[Path, bytes | None] = {}
        self._due: dict[Path, float] = {}            # a failed path is retried from then on
        self._failing: dict[Path, str] = {}
        self._busy: Path | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def put(self, path: Path, data: bytes) -> None:
        """Write `data` to `path` (atomically, by the `write` given) soon; returns at once."""
        self._submit(path, data)

    def remove(self, path: Path) -> None:
        """Remove `path` soon (a missing file is no error); returns at once."""
        self._submit(path, _REMOVE)

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for everything handed over to be written: True when it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def failing(self) -> dict[str, str]:
        """The files whose last write failed, with the error."""
        with self._cond:
            return {str(p): e for p, e in self._failing.items()}

    def _submit(self, path: Path, data: bytes | None) -> None:
        with self._cond:
            self._pending[path] = data
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvwatch-disk-writer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _next(self) -> tuple[Path, bytes | None]:
        with self._cond:
            while True:
                now = self._clock()
                ready = [p for p in self._pending if self._due.get(p, 0.0) <= now]
                if ready:
                    path = ready[0]
                    self._busy = path
                    return path, self._pending.pop(path)
                waits = [self._due[p] - now for p in self._pending if p in self._due]
                self._cond.wait(min(waits) if waits else None)

    def _run(self) -> None:
        while True:
            path, data = self._next()
            error = None
            try:
                if data is _REMOVE:
                    try:
                        self._remove(path)
                    except FileNotFoundError:
                        pass
                else:
                    self._write(path, data)
            except OSError as exc:
                error = exc.strerror or str(exc)
            with self._cond:
                self._busy = None
                if error is None:
                    self._due.pop(path, None)
                    if self._failing.pop(path, None) is not None:
                        _LOG.info("disk: %s written again", path)
                else:
                    self._pending.setdefault(path, data)       # unless a newer content came meanwhile
                    self._due[path] = self._clock() + self._retry
                    if path not in self._failing:
                        _LOG.warning("disk: cannot write %s: %s; kept in memory, retried every %.0fs",
                                     path, error, self._retry)
                    self._failing[path] = error
                self._cond.notify_all()


_SHARED: dict[str, DiskWriter] = {}
_SHARED_LOCK = threading.Lock()
_HELPERS: dict[str, HelperProcess] = {}
# Which helper process makes each writer's calls (write_helper.py: a write blocked in a frozen
# filesystem holds that process, never kvwatch's own exit). The state dir's files share one; the
# learned_dir, often another volume (a fleet's network share), has its own: one hung never holds
# the other's writes.
_HELPER_OF = {"state": "state_dir", "claims": "state_dir", "lock": "state_dir", "learned": "learned_dir"}


def _writer(kind: str) -> DiskWriter:
    with _SHARED_LOCK:
        if kind not in _SHARED:
            helper = _HELPERS.setdefault(_HELPER_OF[kind], HelperProcess())
            write = {"state": helper.write_private, "claims": helper.write_claim,
                     "learned": helper.write_plain, "lock": helper.write_in_place}[kind]
            _SHARED[kind] = DiskWriter(write, helper.remove)
        return _SHARED[kind]


def helper_pids() -> frozenset[int]:
    """kvwatch's own write helpers: its children, never the engine's (the ownership scan skips them)."""
    return frozenset(pid for helper in list(_HELPERS.values()) if (pid := helper.pid) is not None)


def _forget_in_child() -> None:
    """A forked child has neither the writer threads nor a helper of its own: it starts its own."""
    global _SHARED_LOCK
    _SHARED.clear()
    _HELPERS.clear()
    _SHARED_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def shared() -> DiskWriter:
    """The process's writer of state files (the state dir made private first)."""
    return _writer("state")


def claims() -> DiskWriter:
    """The process's writer of host claims (state dir/engines, both made private first)."""
    return _writer("claims")


def learned() -> DiskWriter:
    """The process's writer of shared learned profiles (learned_dir, a directory other hosts share:
    a hung network volume there holds neither the watchdog nor the state file)."""
    return _writer("learned")


def lock_files() -> DiskWriter:
    """The process's writer of the pid line in a lock file (in place: the file's inode is the lock)."""
    return _writer("lock")


def flush_all(timeout: float) -> bool:
    """Wait up to `timeout` in all for every writer: True when everything handed over is written."""
    deadline = time.monotonic() + timeout
    with _SHARED_LOCK:
        writers = list(_SHARED.values())
    return all([w.flush(max(0.0, deadline - time.monotonic())) for w in writers])
