"""Which processes on this host are engines that some kvwatch watches.

Every kvwatch on a host (each `kvwatch run`, each `kvwatch export`) shares one state
directory and keeps one small file there per engine it watches, `<state_dir>/engines/NAME.json`:
its own pid and start time, and the pid and start time of each of the engine's processes. Each
watch tick an instance rewrites its file when the pids changed and reads the others'. A GPU
process is *foreign* only when no kvwatch on the host claims it, so two engines on one host are
never foreign to each other.

Files of a kvwatch that is gone (its pid no longer runs with its start time) are ignored, and so
are pids whose start time no longer matches (a pid reused by another process). The directory is
read defensively: only regular files (no symlinks followed) that nobody but this user or root
could have written, each at most MAX_FILE_BYTES, at most MAX_FILES of them; a malformed or
untrusted file is skipped with one warning. The directory is created private (state_dir.py).
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from kvwatch.boundary import proc_inspect
from kvwatch.boundary.proc_inspect import ProcRef
from kvwatch.watchdog import disk_writer
from kvwatch.watchdog.disk_writer import DiskWriter
from kvwatch.watchdog.state_store import UntrustedFile, read_regular

_LOG = logging.getLogger(__name__)

REGISTRY_DIR = "engines"
MAX_FILE_BYTES = 64 * 1024
MAX_FILES = 256
_MAX_PIDS = 4096
WITHDRAW_SECONDS = 2.0   # at exit, how long the claim's removal may take (a frozen disk: not longer)


class HostRegistry:
    def __init__(self, state_dir: str, name: str, writer: DiskWriter | None = None) -> None:
        self._writer = writer or disk_writer.claims()
        self.directory = os.path.join(state_dir, REGISTRY_DIR)
        self.name = name
        self.path = os.path.join(self.directory, f"{name}.json")
        self._me = proc_inspect.ref_of(os.getpid())
        self._pids: list[int] | None = None          # the pids of the claim last written
        self._warned: set[str] = set()
        # path -> (the file's stat signature, its claim as last parsed): unchanged files are not re-read
        self._claims: dict[str, tuple[tuple[int, ...], tuple[ProcRef, dict[int, float]] | None]] = {}

    # -- this instance's engine ----------------------------------------------------

    def publish(self, pids: Iterable[int]) -> None:
        """Claim the engine's processes for this instance (written only when they changed: the
        start times are looked up then, not every tick)."""
        wanted = sorted(set(pids))[:_MAX_PIDS]
        if wanted == self._pids:
            return
        refs = [r for r in map(proc_inspect.ref_of, wanted) if r is not None]
        me = self._me
        data = {"name": self.name, "kvwatch": [me.pid, me.create_time] if me else None,
                "pids": [[r.pid, r.create_time] for r in refs]}
        # Off the watch loop, directories included (a frozen disk must not stop the snapshots): the
        # writer makes the state dir and engines/ private, removes what a killed write left, and
        # retries a claim that cannot be written (a full disk) until it can, the newest first, so
        # the claim never keeps the pids of an engine that is gone.
        self._writer.put(Path(self.path), json.dumps(data).encode())
        self._pids = wanted

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` for the claim handed to the writer to be on disk: True when it is."""
        return self._writer.flush(timeout)

    def withdraw(self) -> None:
        """Remove this instance's claim (at exit)."""
        self._writer.remove(Path(self.path))
        self._writer.flush(WITHDRAW_SECONDS)
        self._pids = None

    # -- the other instances' engines ----------------------------------------------

    def others(self) -> frozenset[int]:
        """Live pids that other kvwatch instances on this host claim for their engines.

        Cheap whatever the claims say (256 claims of 4,095 pids each took 26 s a tick): a claim
        is parsed again only when its file changed, a pid that does not run is dropped against
        one listing of the process table, and each running pid's start time is read at most once
        per tick, so a tick costs at most one look at each process of the host. The process table
        is listed only when there is another instance's claim to check: an instance alone on its
        host (the usual case) lists nothing."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".json"))[:MAX_FILES]
        except OSError:
            return frozenset()
        listed: list[frozenset[int]] = []
        started: dict[int, float | None] = {}

        def running() -> frozenset[int]:
            if not listed:
                listed.append(proc_inspect.running_pids())
            return listed[0]

        def same(ref: ProcRef) -> bool:
            if ref.pid not in running():
                return False
            if ref.pid not in started:
                started[ref.pid] = proc_inspect.create_time(ref.pid)
            when = started[ref.pid]
            return when is not None and abs(when - ref.create_time) <= proc_inspect.CT_TOLERANCE

        out: set[int] = set()
        seen: set[str] = set()
        for name in names:
            path = os.path.join(self.directory, name)
            if path == self.path:
                continue
            seen.add(path)
            claim = self._claim(path)
            if claim is None:
                continue
            owner, claimed = claim
            if not same(owner):
                continue                      # that kvwatch is gone: its claim lapsed
            out.update(pid for pid in claimed.keys() & running() if same(ProcRef(pid, claimed[pid])))
        for stale in set(self._claims) - seen:
            del self._claims[stale]
        return frozenset(out)

    def _claim(self, path: str) -> tuple[ProcRef, dict[int, float]] | None:
        """The claim in `path` (its kvwatch; pid -> start time of its engine's processes), parsed
        again only when the file changed."""
        try:
            info = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        key = (info.st_ino, info.st_mtime_ns, info.st_size, info.st_mode, info.st_uid, info.st_nlink)
        cached = self._claims.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        data = self._read(path)
        owner = _ref(data.get("kvwatch")) if data is not None else None
        items = data.get("pids") if data is not None else None
        claim = None
        if owner is not None and isinstance(items, list):
            claim = owner, _claimed(items[:_MAX_PIDS])
        self._claims[path] = (key, claim)
        return claim

    def _read(self, path: str) -> dict | None:
        try:
            raw = read_regular(Path(path), MAX_FILE_BYTES, trusted_only=True)
        except UntrustedFile as exc:
            # A forged claim would hide a GPU hog from the foreign-memory alert.
            self._warn(path, f"host registry: {path} could have been written by someone else ({exc}); ignored")
            return None
        except ValueError:
            self._warn(path, f"host registry: {path} is not a small regular file; ignored")
            return None
        except OSError:
            return None                       # gone meanwhile, or a symlink
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            self._warn(path, f"host registry: {path} is not JSON; ignored")
            return None
        return data if isinstance(data, dict) else None

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _LOG.warning("%s", message)


def _claimed(items: list) -> dict[int, float]:
    """pid -> start time of a claim's [pid, start time] pairs (the malformed ones left out); a
    plain loop over at most _MAX_PIDS items, no object made per pair."""
    out: dict[int, float] = {}
    for item in items:
        if type(item) is list and len(item) == 2:
            pid, when = item
            if type(pid) is int and pid > 0 and type(when) in (int, float):
                out[pid] = float(when)
    return out


def _ref(item: object) -> ProcRef | None:
    if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and not isinstance(item[0], bool)
            and isinstance(item[1], (int, float)) and not isinstance(item[1], bool) and item[0] > 0):
        return ProcRef(item[0], float(item[1]))
    return None
