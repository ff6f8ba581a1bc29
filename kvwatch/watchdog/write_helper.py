"""kvwatch's file writes done by a separate process: `python -m kvwatch.watchdog.write_helper`.

A write to a frozen filesystem (fsfreeze, a hung network volume) puts the writing thread in
uninterruptible sleep until the thaw, and a process keeps existing while one of its threads is in
it: kvwatch had stopped its engine on SIGTERM but did not exit (the thread of disk_writer.py was
still in the kernel). So the blocking calls (mkdir, chmod, the temporary file, fsync, rename,
unlink) are this helper's: kvwatch only talks to it over a pipe, which never blocks on a disk, and
exits whatever the helper does. The helper runs in its own session (a terminal's Ctrl-C does not cut
a write short), finishes the write it is in after kvwatch is gone, and exits when its stdin ends.

One request: a header `>BHI` (operation, path length, data length), the path (UTF-8), the data.
One answer per request, a line: `ok`, or `err ERRNO MESSAGE`.
"""
from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import BinaryIO

WRITE_PRIVATE = 1    # the file, its directory made private first (state_dir.ensure_private_dir)
WRITE_CLAIM = 2      # as WRITE_PRIVATE, and the directory above it too (engines/ in the state dir)
WRITE_PLAIN = 3      # the file, missing directories made with the default mode (a shared learned_dir)
REMOVE = 4           # a missing file is no error
WRITE_IN_PLACE = 5   # truncate and write an existing file, never replaced (a lock file: its inode is the lock)

_HEADER = struct.Struct(">BHI")
_MAX_PATH = 0xFFFF


class HelperProcess:
    """The client: one helper process, started on first use and again after it died."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def write_private(self, path: Path, data: bytes) -> None:
        self._call(WRITE_PRIVATE, path, data)

    def write_claim(self, path: Path, data: bytes) -> None:
        self._call(WRITE_CLAIM, path, data)

    def write_plain(self, path: Path, data: bytes) -> None:
        self._call(WRITE_PLAIN, path, data)

    def write_in_place(self, path: Path, data: bytes) -> None:
        self._call(WRITE_IN_PLACE, path, data)

    def remove(self, path: Path) -> None:
        self._call(REMOVE, path, b"")

    def _call(self, op: int, path: Path, data: bytes) -> None:
        """OSError (the helper's errno) when the operation failed or the helper is gone; blocks,
        interruptibly, for as long as the helper's disk does (disk_writer.py calls it from its thread)."""
        encoded = os.fsencode(path)
        if len(encoded) > _MAX_PATH:   # the header's field; the disk writer's thread only survives OSError
            raise OSError(errno.ENAMETOOLONG, "path too long for the write helper")
        with self._lock:
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(_HEADER.pack(op, len(encoded), len(data)) + encoded + data)
                proc.stdin.flush()
                answer = proc.stdout.readline()
            except OSError:
                answer = b""
            if not answer:
                self._proc = None
                proc.kill()
                proc.wait()
                raise OSError(f"the write helper ended (exit {proc.returncode})")
        if answer.startswith(b"ok"):
            return
        _, number, message = (answer.decode("utf-8", "replace").rstrip("\n").split(" ", 2) + ["", ""])[:3]
        raise OSError(int(number) if number.isdigit() else 0, message or "write failed")

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            env = dict(os.environ, PYTHONPATH=_package_root())
            # Not kvwatch's stderr: a helper blocked past kvwatch's exit would keep its reader (a
            # pipe to docker, `| tee`) waiting for an end; its errors come back as answers.
            self._proc = subprocess.Popen([sys.executable, "-m", "kvwatch.watchdog.write_helper"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, env=env, start_new_session=True,
                                          close_fds=True)
        return self._proc

    def close(self) -> None:
        """End the helper's stdin: it exits after the write it is in (tests; kvwatch just exits)."""
        with self._lock:
            if self._proc is not None and self._proc.stdin is not None:
                self._proc.stdin.close()
            self._proc = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None


def _package_root() -> str:
    """The directory holding the kvwatch package: the helper imports this same kvwatch."""
    import kvwatch
    here = os.path.dirname(os.path.dirname(os.path.abspath(kvwatch.__file__)))
    existing = os.environ.get("PYTHONPATH")
    return here + (os.pathsep + existing if existing else "")


# -- the helper itself --------------------------------------------------------------------

def _do(op: int, path: Path, data: bytes) -> None:
    from kvwatch.watchdog.atomic_file import remove_stale_temporaries, write_atomic
    from kvwatch.watchdog.state_dir import ensure_private_dir
    if op == REMOVE:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    if op == WRITE_IN_PLACE:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_TRUNC)   # never through a symlink
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return
    if op == WRITE_CLAIM:
        ensure_private_dir(path.parent.parent)   # else made 0755 as a parent of engines/
    if op in (WRITE_PRIVATE, WRITE_CLAIM):
        ensure_private_dir(path.parent)
        remove_stale_temporaries(path)             # a helper killed mid-write left one; none of ours is open
    elif op == WRITE_PLAIN:
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        raise OSError(0, f"unknown operation {op}")
    write_atomic(path, data)


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n) if n else b""
    return data if len(data) == n else None


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    while True:
        header = _read_exactly(requests, _HEADER.size)
        if header is None:
            return   # kvwatch is gone (or closed us): nothing more to write
        op, path_len, data_len = _HEADER.unpack(header)
        path, data = _read_exactly(requests, path_len), _read_exactly(requests, data_len)
        if path is None or data is None:
            return
        try:
            _do(op, Path(os.fsdecode(path)), data)
            answer = b"ok\n"
        except OSError as exc:
            message = (exc.strerror or str(exc)).replace("\n", " ")
            answer = f"err {exc.errno or 0} {message}\n".encode()
        try:
            answers.write(answer)
            answers.flush()
        except BrokenPipeError:
            return   # kvwatch left while this write was blocked: it is done all the same


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
