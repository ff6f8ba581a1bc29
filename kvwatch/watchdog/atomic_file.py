"""A file written whole or not at all, and what a write killed midway leaves (the state directory's and the
learned store's files). Kept apart from the state store so the write helper's process imports it alone."""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

_LOG = logging.getLogger("kvwatch.watchdog.state_store")


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_stale_temporaries(path: Path) -> int:
    """Remove write_atomic's temporary files of `path` (a kill -9 mid-write leaves one behind)."""
    removed = 0
    try:
        names = os.listdir(path.parent)
    except OSError:
        return 0
    prefix = _temporary_prefix(path)
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp"):
            try:
                os.unlink(path.parent / name)
                removed += 1
            except OSError:
                pass
    if removed:
        _LOG.info("state: removed %d temporary file(s) of %s left by a kvwatch killed mid-write", removed, path.name)
    return removed


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)  # the rename itself must survive a power cut
    finally:
        os.close(dir_fd)
