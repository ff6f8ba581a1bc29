"""One JSON state file per engine in the state dir: what kvwatch learned, surviving restarts.

Written atomically (temp file in the same dir, fsync, rename, fsync the dir), so a
reader (`kvwatch status`) or a crash never sees half a file. A file that cannot be
read or parsed is moved aside to NAME.json.corrupt-<time> with a warning: kvwatch then
starts from nothing rather than not at all.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import time
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Union

from kvwatch.boundary.bounded_read import read_bounded
from kvwatch.errors import KvwatchError
from kvwatch.watchdog import disk_writer
from kvwatch.watchdog.atomic_file import remove_stale_temporaries, write_atomic
from kvwatch.watchdog.records import Constraint, CorrectionRecord, FailureRecord, HostMemoryStop, PreflightFix
from kvwatch.watchdog.state_dir import ensure_private_dir, open_to_others, untrusted_file

__all__ = ["Constraint", "CorrectionRecord", "EngineLock", "EngineRecord", "FailureRecord", "HostMemoryStop",
           "PreflightFix", "StateStore", "UntrustedFile", "load_all", "read_regular", "remove_stale_temporaries",
           "write_atomic"]

_LOG = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MAX_FAILURES = 100      # kept in the file; older ones are dropped
MAX_CORRECTIONS = 100
MAX_AUTOPILOT_CHANGES = 100
MAX_HOST_MEMORY_STOPS = 20


@dataclass
class EngineRecord:
    name: str
    original_argv: list[str] = field(default_factory=list)   # the command as configured
    argv: list[str] = field(default_factory=list)            # the (corrected) command in force
    state: str = "stopped"
    reason: str = ""
    updated: float = 0.0
    kvwatch_pid: int | None = None
    kvwatch_create_time: float | None = None
    pgid: int | None = None
    pids: list[dict[str, Any]] = field(default_factory=list)  # {"pid", "create_time", "name"}
    engine_proof: dict[str, Any] = field(default_factory=dict)  # ownership.EngineProof, recorded at spawn
    plans_tried: list[list[str]] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    corrections: list[CorrectionRecord] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    preflight: list[PreflightFix] = field(default_factory=list)        # fixes applied before launching
    foreign: list[str] = field(default_factory=list)                   # others holding our port or GPUs
    escaped: list[str] = field(default_factory=list)   # like the engine's, not provably (ownership.py): left alone
    learned_non_kv: dict[str, int] = field(default_factory=dict)   # non-KV memory by gpu_budget.profile_key
    log_kv_tokens: int | None = None
    log_available_kv_bytes: int | None = None
    log_memory_parts: dict[str, int] = field(default_factory=dict)   # one GPU's memory by part, as logged
    recommendation: dict[str, Any] = field(default_factory=dict)     # KV pressure: the change, why, its effect
    # [autopilot]: the change being measured ({} when none), each change applied with its measured
    # result (newest last), the changes rolled back by profile (never tried again), and the counts
    # of this kvwatch run (applied, kept, rolled_back).
    autopilot_trial: dict[str, Any] = field(default_factory=dict)
    autopilot_changes: list[dict[str, Any]] = field(default_factory=list)
    autopilot_rolled_back: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    autopilot_counts: dict[str, int] = field(default_factory=dict)
    vllm_release: str | None = None                 # the engine's vLLM release at the last launch
    vllm_startup_plan: str | None = None            # the file of vLLM's own start-up plan, as it logged it
    # Each stop of the engine group before host memory wedged the host (newest last): saved before the
    # stop, so the next start, after a reboot too, diagnoses it (records.HostMemoryStop).
    host_memory_stops: list[HostMemoryStop] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)      # this run of kvwatch, by class
    failure_counts: dict[str, int] = field(default_factory=dict)
    correction_counts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["corrections"] = [c.to_json() for c in self.corrections]
        out["constraints"] = [c.to_json() for c in self.constraints]
        out["preflight"] = [p.to_json() for p in self.preflight]
        out["host_memory_stops"] = [h.to_json() for h in self.host_memory_stops]
        out["version"] = SCHEMA_VERSION
        return out

    @classmethod
    def from_json(cls, data: Any) -> EngineRecord:
        """Raises ValueError (or TypeError/KeyError) on anything that is not a record."""
        if not isinstance(data, dict) or data.get("version") != SCHEMA_VERSION:
            raise ValueError(f"not a kvwatch state file of version {SCHEMA_VERSION}")
        _check_types(data)
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known and (v is not None or k in _OPTIONAL)}
        record = cls(**values)
        record.failures = [FailureRecord.from_json(f) for f in data.get("failures") or []]
        record.corrections = [CorrectionRecord.from_json(c) for c in data.get("corrections") or []]
        record.constraints = [Constraint.from_json(c) for c in data.get("constraints") or []]
        record.preflight = [PreflightFix.from_json(p) for p in data.get("preflight") or []]
        record.host_memory_stops = [HostMemoryStop.from_json(h) for h in data.get("host_memory_stops") or []]
        if not isinstance(record.name, str) or not all(isinstance(a, str) for a in record.argv):
            raise ValueError("bad name or argv")
        return record

    def last_failure(self) -> FailureRecord | None:
        return self.failures[-1] if self.failures else None

    def trim(self) -> None:
        del self.failures[:-MAX_FAILURES]
        del self.corrections[:-MAX_CORRECTIONS]
        del self.autopilot_changes[:-MAX_AUTOPILOT_CHANGES]
        del self.host_memory_stops[:-MAX_HOST_MEMORY_STOPS]


MAX_STATE_BYTES = 8 << 20   # a state file is a few KB; failures and corrections are trimmed


class UntrustedFile(ValueError):
    """A file someone other than kvwatch could have written (state_dir.untrusted_file)."""


def read_regular(path: Path, max_bytes: int = MAX_STATE_BYTES, trusted_only: bool = False) -> bytes:
    """A file kvwatch wrote: regular, never through a symlink, at most `max_bytes` (the shared
    bounded reader; OSError or ValueError otherwise); with `trusted_only`, only a file nobody but
    this user or root could have written (UntrustedFile otherwise)."""
    return read_bounded(path, max_bytes, follow_symlinks=False, vet=_trusted if trusted_only else None)


def _trusted(info: os.stat_result) -> None:
    why = untrusted_file(info)
    if why:
        raise UntrustedFile(why)


_MAX_PID = 1 << 31   # above any pid_max; psutil and os.kill raise (not return) beyond it


def _is_pid(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < _MAX_PID


def _matches(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the type a field's annotation names (records in lists are left
    to their own from_json; a bool is not a number)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint in (int, str, bool):
        return isinstance(value, hint) and (hint is bool or not isinstance(value, bool))
    if origin is list:
        return isinstance(value, list) and all(_matches(x, args[0]) for x in value)
    if origin is dict:
        return isinstance(value, dict) and all(_matches(k, args[0]) and _matches(v, args[1])
                                               for k, v in value.items())
    return True   # a record (FailureRecord, ...): checked by its own from_json


def _field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(EngineRecord)
    return {f.name: hints[f.name] for f in fields(EngineRecord)}


_FIELD_TYPES: dict[str, Any] = _field_types()
_OPTIONAL = frozenset(k for k, hint in _FIELD_TYPES.items() if _matches(None, hint))
_PID_FIELDS = ("kvwatch_pid", "pgid")


def _check_types(data: dict) -> None:
    """Every field of the record, of the type it is declared (and read) as; a null stands for an
    absent field (its default)."""
    for key, hint in _FIELD_TYPES.items():
        value = data.get(key)
        if value is not None and not _matches(value, hint):
            raise ValueError(f"field {key!r} is {type(value).__name__}, not {hint}")
    for key in _PID_FIELDS:
        if data.get(key) is not None and not _is_pid(data[key]):
            raise ValueError(f"field {key!r} is not a pid")
    for pid in data.get("pids") or []:
        if not (isinstance(pid, dict) and _is_pid(pid.get("pid"))
                and _matches(pid.get("create_time"), float)):
            raise ValueError("bad pids entry")
    for item in (data.get("failures") or []) + (data.get("corrections") or []):
        if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
            raise ValueError("bad failure or correction")


class _Writer(typing.Protocol):
    def put(self, path: Path, data: bytes) -> None: ...


class StateStore:
    """With a `writer` (disk_writer.DiskWriter: what the supervisor passes), save() hands the file
    over and returns at once; without one it writes before returning."""

    def __init__(self, state_dir: str | os.PathLike[str], name: str, writer: _Writer | None = None) -> None:
        self.dir = Path(state_dir)
        self.name = name
        self.path = self.dir / f"{name}.json"
        self._writer = writer

    def remove_stale_temporaries(self) -> int:
        """Remove the temporary files a kvwatch killed mid-write left of this engine's state file
        (call it holding the engine's lock: no other kvwatch writes them then). Returns how many."""
        return remove_stale_temporaries(self.path)

    def ensure_dir(self) -> None:
        """Create the state dir private (state_dir.ensure_private_dir); warn once when others may write it."""
        try:
            ensure_private_dir(self.dir)
            open_why = open_to_others(self.dir)
        except OSError as exc:
            raise KvwatchError(f"state dir {self.dir}: cannot create: {exc.strerror or exc}") from None
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise KvwatchError(f"state dir {self.dir}: not writable")
        if open_why:
            _LOG.warning("state dir %s is %s: kvwatch reads only the files in it that nobody else could have "
                         "written; make it kvwatch's own (chmod 0750)", self.dir, open_why)

    def load(self) -> EngineRecord | None:
        """The record, None if there is none; a corrupt file, or one someone else could have written
        (its command would be launched), is moved aside (never raises)."""
        try:
            text = read_regular(self.path, trusted_only=True).decode("utf-8")
        except FileNotFoundError:
            return None
        except UntrustedFile as exc:
            self._move_aside(f"could have been written by someone else ({exc}); its command is not launched",
                             "untrusted")
            return None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self._move_aside(f"unreadable: {exc}")
            return None
        try:
            return EngineRecord.from_json(json.loads(text))
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            self._move_aside(f"corrupt: {exc}")
            return None

    def save(self, record: EngineRecord) -> None:
        record.updated = time.time()
        record.trim()
        data = json.dumps(record.to_json(), indent=1, sort_keys=True).encode()
        if self._writer is not None:
            self._writer.put(self.path, data)
        else:
            write_atomic(self.path, data)

    def _move_aside(self, why: str, label: str = "corrupt") -> None:
        target = self.path.with_name(f"{self.path.name}.{label}-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(self.path, target)
            _LOG.warning("state: %s %s; moved aside to %s, starting fresh", self.path, why, target.name)
        except OSError as exc:
            _LOG.warning("state: %s %s; cannot move it aside (%s), starting fresh", self.path, why, exc)




def load_all(state_dir: str | os.PathLike[str]) -> list[tuple[Path, EngineRecord | None]]:
    """Every engine's record in a state dir, read-only (a corrupt file is reported as None, not moved)."""
    out: list[tuple[Path, EngineRecord | None]] = []
    directory = Path(state_dir)
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.json")):
        try:
            out.append((path, EngineRecord.from_json(json.loads(read_regular(path).decode("utf-8")))))
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, RecursionError):
            out.append((path, None))
    return out


LOCK_PID_SECONDS = 2.0


class EngineLock:
    """An exclusive flock on NAME.lock: two kvwatch daemons must not supervise one engine.
    The kernel drops it when kvwatch dies, kill -9 included."""

    def __init__(self, state_dir: str | os.PathLike[str], name: str) -> None:
        self.path = Path(state_dir) / f"{name}.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        # Read-only: a descriptor open for writing would keep the filesystem from being remounted
        # read-only under a running kvwatch. Never through a symlink: a NAME.lock linked elsewhere
        # would have us write that file.
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o640)
        except OSError as exc:
            raise KvwatchError(f"lock file {self.path}: {exc.strerror or exc} (a symlink is refused)") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise KvwatchError(f"lock file {self.path}: not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise KvwatchError(f"another kvwatch (pid {holder}) already supervises engine "
                               f"{self.path.stem!r} in {self.path.parent}") from None
        self._fd = fd
        # The pid only names the holder in the message above; the flock is the lock. Written in place
        # (a rename would make another file, which another kvwatch could lock) by the write helper: on a
        # frozen disk kvwatch starts, and answers SIGTERM, after LOCK_PID_SECONDS at most.
        writer = disk_writer.lock_files()
        writer.put(self.path, f"{os.getpid()}\n".encode())
        if not writer.flush(LOCK_PID_SECONDS):
            _LOG.warning("lock file %s: kvwatch's pid not written yet (the disk does not answer; the lock holds)",
                         self.path)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
