"""The one reader of files a user or another process names: regular files only, size-capped.

A plain open() of a FIFO blocks until a writer comes (kvwatch hung at start-up with no output on a
config file that was one); a device or /dev/zero never ends. Every file is opened with O_NONBLOCK
(which never blocks the open, and does nothing to a regular file's reads), checked with fstat on
that same descriptor (no window between the check and the read), and read to a cap.
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFile(ValueError):
    """The path is a FIFO, a device, a socket or a directory: its message says which."""


class FileTooLarge(ValueError):
    """The file holds more than the reader's cap."""


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


@contextmanager
def open_regular(path: str | os.PathLike[str], follow_symlinks: bool = True,
                 vet: Callable[[os.stat_result], None] | None = None) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """The open file and its fstat, only when it is a regular file (NotRegularFile otherwise).
    Without `follow_symlinks` a symlink is refused (OSError ELOOP): a state file kvwatch wrote is
    never one. `vet` may raise on the file's fstat (an owner check) before a byte is read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno != errno.ENXIO:   # a socket, or a device without its driver, cannot be opened at all
            raise
        raise NotRegularFile(f"not a regular file ({kind_of(os.stat(path).st_mode)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"not a regular file ({kind_of(info.st_mode)})")
        if vet is not None:
            vet(info)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f, info


def read_bounded(path: str | os.PathLike[str], max_bytes: int, follow_symlinks: bool = True,
                 vet: Callable[[os.stat_result], None] | None = None) -> bytes:
    """A regular file's bytes, at most `max_bytes` (FileTooLarge beyond it, never a truncated
    read: a cut config would silently lose its later sections). OSError when it cannot be opened."""
    with open_regular(path, follow_symlinks, vet) as (f, info):
        if info.st_size > max_bytes:
            raise FileTooLarge(f"larger than {_size(max_bytes)}")
        data = f.read(max_bytes + 1)   # a file that grew since fstat, or a /proc-like size of 0
    if len(data) > max_bytes:
        raise FileTooLarge(f"larger than {_size(max_bytes)}")
    return data


def check_regular(path: str | os.PathLike[str]) -> None:
    """Raise unless `path` is a regular file, for files a library opens itself (TLS keys: OpenSSL
    would block on a FIFO just the same)."""
    with open_regular(path):
        pass


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def read_kernel_file(path: str | os.PathLike[str], max_bytes: int = 64 << 10) -> str | None:
    """A /proc, /sys or cgroup file's text (their size reads 0, so none is checked), at most `max_bytes`;
    None when it cannot be read. Opened non-blocking, as every file here is."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return None
