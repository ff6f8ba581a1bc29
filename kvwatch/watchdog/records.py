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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailureRecord:
        evidence = data["evidence"]
        if evidence is not None and not isinstance(evidence, str):
            raise ValueError("'evidence' is not a string")
        return cls(_kind(_str(data, "kind")), evidence, _number(data, "time"), _str_list(data, "argv"),
                   _str(data, "reason") if "reason" in data else "", _str(data, "phase") if "phase" in data else "")


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
