"""What the state file remembers of one engine's failures and changes, as values (pure).

Each record has to_json() and from_json() in the state file's form; from_json() also reads the
forms earlier kvwatch versions wrote (those files are on users' disks) and raises ValueError,
TypeError or KeyError on anything that is not a record.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange

PREFLIGHT, FAILURE = "preflight", "failure"   # where a constraint was learned


@dataclass
class FailureRecord:
    kind: FailureKind
    evidence: str | None
    time: float                     # wall clock (time.time()), for people
    argv: list[str]
    reason: str = ""                # what kvwatch made of it
    phase: str = ""                 # how far the start had come (diagnosis/start_phase.py); "" in old files
    stacks: str = ""                # a stall's thread stacks, as read before the restart (capped)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailureRecord:
        evidence = data["evidence"]
        if evidence is not None and not isinstance(evidence, str):
            raise ValueError("'evidence' is not a string")
        return cls(_kind(_str(data, "kind")), evidence, _number(data, "time"), _str_list(data, "argv"),
                   _str(data, "reason") if "reason" in data else "", _str(data, "phase") if "phase" in data else "",
                   _str(data, "stacks") if "stacks" in data else "")


@dataclass(frozen=True)
class PreflightFix:
    """A fix applied before the first launch, for a failure the plan said was certain."""

    kind: FailureKind
    message: str
    change: FlagChange

    def to_json(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "message": self.message, **self.change.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreflightFix:
        return cls(_kind(_str(data, "kind")), str(data.get("message") or ""), FlagChange.from_json(data))


@dataclass
class CorrectionRecord:
    """A corrected plan: the change made after a failure, and the commands before and after."""

    kind: FailureKind
    change: FlagChange
    reason: str
    time: float
    from_argv: list[str]
    to_argv: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"kind": str(self.kind), **self.change.to_json(), "reason": self.reason, "time": self.time,
                "from_argv": list(self.from_argv), "to_argv": list(self.to_argv)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CorrectionRecord:
        return cls(_kind(_str(data, "kind")), FlagChange.from_json(data), str(data["reason"]), _number(data, "time"),
                   _str_list(data, "from_argv"), _str_list(data, "to_argv"))


@dataclass
class Constraint:
    """What this host's engine taught: a failure (or a certain one, before the launch) and its fix,
    and the block sizes its backends really accept (fed to the next plans' rules)."""

    kind: FailureKind = FailureKind.UNKNOWN
    text: str = ""
    change: FlagChange = NO_CHANGE
    source: str = ""                 # PREFLIGHT or FAILURE
    backend_block_sizes: dict[str, list[Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": str(self.kind), "text": self.text, **self.change.to_json(), "source": self.source}
        if self.backend_block_sizes:
            out["backend_block_sizes"] = {k: list(v) for k, v in self.backend_block_sizes.items()}
        return out

    @classmethod
    def from_json(cls, data: Any) -> Constraint:
        if not isinstance(data, Mapping):
            raise ValueError("a constraint is not an object")
        sizes = data.get("backend_block_sizes") or {}
        if not isinstance(sizes, Mapping) or not all(isinstance(k, str) and isinstance(v, list)
                                                     for k, v in sizes.items()):
            raise ValueError("bad backend_block_sizes")
        # Before FlagChange, the flags set were written as "fix" (and, from failures only, "remove").
        change = FlagChange.from_json({"set": data.get("set", data.get("fix")), "remove": data.get("remove")})
        return cls(_kind(str(data.get("kind") or "")), str(data.get("text") or ""), change,
                   str(data.get("source") or ""), {k: list(v) for k, v in sizes.items()})


@dataclass
class HostMemoryStop:
    """kvwatch stopped the engine group before host memory wedged the host (unified-memory hosts:
    watchdog/host_memory_watch.py). Saved before the stop, read at the next start, after a reboot too:
    that start says what happened and re-plans rather than repeat it."""

    time: float                         # wall clock
    phase: str                          # how far the engine had come (loading, profiling, serving, ...)
    reason: str                         # the verdict's reason
    argv: list[str]                     # the command stopped
    available_bytes: int | None = None  # MemAvailable at the stop
    total_bytes: int | None = None      # MemTotal
    some_avg10: float | None = None     # memory pressure (PSI), %
    full_avg10: float | None = None
    boot_id: str = ""                   # the kernel's boot id then: another at the next start, a reboot since

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "phase": self.phase, "reason": self.reason, "argv": list(self.argv),
                "available_bytes": self.available_bytes, "total_bytes": self.total_bytes,
                "some_avg10": self.some_avg10, "full_avg10": self.full_avg10, "boot_id": self.boot_id}

    @classmethod
    def from_json(cls, data: Any) -> HostMemoryStop:
        if not isinstance(data, Mapping):
            raise ValueError("a host memory stop is not an object")
        return cls(_number(data, "time"), _str(data, "phase"), _str(data, "reason"), _str_list(data, "argv"),
                   _optional_int(data, "available_bytes"), _optional_int(data, "total_bytes"),
                   _optional_number(data, "some_avg10"), _optional_number(data, "full_avg10"),
                   _str(data, "boot_id") if "boot_id" in data else "")


def _kind(value: str) -> FailureKind:
    """A failure class as written; one this kvwatch does not know (a file from a newer or much older
    kvwatch, or a constraint written without one) is read as UNKNOWN, not refused."""
    try:
        return FailureKind(value)
    except ValueError:
        return FailureKind.UNKNOWN


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str):
        raise ValueError(f"{key!r} is not a string")
    return value


def _number(data: Mapping[str, Any], key: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key!r} is not a number")
    return float(value)


def _str_list(data: Mapping[str, Any], key: str) -> list[str]:
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{key!r} is not a list of strings")
    return list(value)


def _optional_int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key!r} is not a whole number")
    return value


def _optional_number(data: Mapping[str, Any], key: str) -> float | None:
    return _number(data, key) if data.get(key) is not None else None
