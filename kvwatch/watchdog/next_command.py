"""The command the engine is launched with next, decided in one place (pure).

The command in force changes for four causes, and only here:

- kvwatch starts: the state file's corrected command is reused when it is the configured command's
  (the same original, only kvwatch's own flag changes: persisted_command.py), else the configured one;
- the preflight fixed failures that are certain before the first launch;
- a failure (or a stop for host memory an earlier kvwatch made): recovery.decide's decision gives up,
  restarts the same command or corrects it;
- the autopilot puts a KV-pressure change on trial, or rolls it back to the command before it.

The supervisor, the start-up and the autopilot act on the answer: they never build a command themselves.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.watchdog.persisted_command import judge_persisted
from kvwatch.watchdog.recovery import Action, Decision


class Source(enum.Enum):
    CONFIGURED = "configured"    # the configured command (no state file, or one for another command)
    PERSISTED = "persisted"      # the state file's command, reused
    REFUSED = "refused"          # the state file's command is not kvwatch's: the configured one instead
    PREFLIGHT = "preflight"      # the certain fixes applied before the first launch
    RESTART = "restart"          # the same command again
    CORRECTED = "corrected"      # a remedy's change
    GIVE_UP = "give_up"          # none: FATAL
    APPLIED = "applied"          # the autopilot's change, on trial
    ROLLED_BACK = "rolled_back"  # the command before the autopilot's change
    UNCHANGED = "unchanged"      # nothing to change (no preflight fix)


@dataclass(frozen=True)
class AtStart:
    """kvwatch starts with `current` as configured; the state file says what an earlier kvwatch ran."""
    original_argv: Sequence[str] | None   # the configured command the state file's command came from
    argv: Sequence[str] | None            # the state file's command (None: no state file)
    fixed_flags: Sequence[str] = ()


@dataclass(frozen=True)
class Preflighted:
    """The preflight's command and whether it fixed anything."""
    command: EngineCommand
    fixed: bool


@dataclass(frozen=True)
class Recovered:
    """After a failure: recovery.decide's decision."""
    decision: Decision


@dataclass(frozen=True)
class Applied:
    """The autopilot puts `change` on trial."""
    change: FlagChange


@dataclass(frozen=True)
class RolledBack:
    """The autopilot's change is rolled back: the command it was applied to again."""
    before_argv: Sequence[str]
    change: FlagChange


Cause = AtStart | Preflighted | Recovered | Applied | RolledBack


@dataclass(frozen=True)
class Next:
    command: EngineCommand | None   # None: nothing is launched again (give up)
    source: Source
    reason: str = ""                # why, in words (the refusal of a state file's command, the relaunch's why)


def next_command(current: EngineCommand, cause: Cause) -> Next:
    """The command to launch next, from the command in force and what happened."""
    if isinstance(cause, AtStart):
        return _at_start(current, cause)
    if isinstance(cause, Preflighted):
        return Next(cause.command, Source.PREFLIGHT) if cause.fixed else Next(current, Source.UNCHANGED)
    if isinstance(cause, Recovered):
        decision = cause.decision
        if decision.action is Action.GIVE_UP:
            return Next(None, Source.GIVE_UP, decision.reason)
        if decision.action is Action.RESTART or decision.command is None:
            return Next(current, Source.RESTART, decision.reason)
        return Next(decision.command, Source.CORRECTED, decision.reason)
    if isinstance(cause, Applied):
        return Next(cause.change.apply(current), Source.APPLIED, f"apply {cause.change.describe()}")
    return Next(EngineCommand(tuple(cause.before_argv), current.release), Source.ROLLED_BACK,
                f"roll back {cause.change.describe()}")


def _at_start(configured: EngineCommand, start: AtStart) -> Next:
    """The state file's command only where it is the configured command's with kvwatch's own changes."""
    if start.argv is None:
        return Next(configured, Source.CONFIGURED)
    if start.original_argv is None or list(start.original_argv) != list(configured.argv) or not start.argv:
        return Next(configured, Source.CONFIGURED, "the engine command changed")
    verdict = judge_persisted(list(start.argv), list(configured.argv), configured.release, start.fixed_flags)
    if not verdict.accepted:
        return Next(configured, Source.REFUSED, verdict.reason)
    return Next(EngineCommand(tuple(start.argv), configured.release), Source.PERSISTED)
