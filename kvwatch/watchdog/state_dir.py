"""The state directory every kvwatch on a host shares: created private, whoever creates it, and
read only where nobody but kvwatch could have written.

What is in it chooses what runs: a state file's command is launched by the next `kvwatch run`
(often as root), and a claim in engines/ decides which GPU memory counts as foreign. So:

- the directory is created 0750 and its subdirectories too, whichever kvwatch (run or export)
  gets there first and whatever the umask: `mkdir` with the final mode (a umask only takes bits
  away, so the directory is never more open than that, not even for a moment), then `chmod`;
- a directory others may write (1777, 0777, group-writable) is used with one warning;
- a file in it is believed only when this user or root owns it, nobody else may write it and it
  has one link (a hard link to someone else's file is not ours to read as a state file).
"""
from __future__ import annotations

import os
import stat

DIR_MODE = 0o750      # kvwatch and its group (a dashboard user) read; only kvwatch writes
PARENT_MODE = 0o755   # directories above the state directory that kvwatch had to create


def ensure_private_dir(path: str | os.PathLike[str]) -> None:
    """Create `path` (and any missing parent) as described above. Raises OSError."""
    target = os.path.abspath(path)
    missing: list[str] = []
    current = target
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        mode = DIR_MODE if directory == target else PARENT_MODE
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            continue     # another kvwatch made it meanwhile, by this same function
        os.chmod(directory, mode)   # the umask may have taken bits kvwatch's group needs


def open_to_others(path: str | os.PathLike[str]) -> str | None:
    """Why a directory is not kvwatch's alone (None when it is): writable by others, or owned by
    a user that is neither this one nor root."""
    info = os.stat(path)
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWOTH | stat.S_IWGRP):
        who = "anyone" if mode & stat.S_IWOTH else "its group"
        return f"writable by {who} (mode {mode:04o})"
    if info.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {info.st_uid}, not by this user ({os.geteuid()}) or root"
    return None


def untrusted_file(info: os.stat_result) -> str | None:
    """Why a file (its fstat) may have been written by someone else (None when it cannot)."""
    if info.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {info.st_uid}"
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWOTH | stat.S_IWGRP):
        return f"writable by others (mode {mode:04o})"
    if info.st_nlink != 1:
        return f"has {info.st_nlink} links"
    return None
