"""What the state file keeps of the autopilot (pure): each change with its figures before and after and
its result, and the changes rolled back per profile (never tried again there). Values in, values out:
the autopilot controller stores what these return.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.pressure import Window
from kvwatch.watchdog.autopilot import Trial, Verdict, figures
from kvwatch.watchdog.memory_learning import MAX_LEARNED_PROFILES

MAX_ROLLED_BACK = 32       # rolled-back changes remembered per profile (the decision table has five kinds)
ON_TRIAL = "on_trial"


def rolled_back(rolled: Mapping[str, Sequence[Any]], profile: str) -> list[FlagChange]:
    """The changes rolled back for `profile`; an entry that does not read as a change is skipped."""
    out = []
    for item in rolled.get(profile, []):
        try:
            out.append(FlagChange.from_json(item))
        except (ValueError, TypeError, AttributeError):
            continue
    return out


def applied_times(changes: Sequence[object]) -> list[float]:
    """When each recorded change was applied (epoch seconds): the daily limit counts them."""
    return [float(c["at"]) for c in changes if isinstance(c, dict) and isinstance(c.get("at"), (int, float))]


def opened(trial: Trial, when: str) -> dict[str, Any]:
    """The entry of a change put on trial (`when`: "window" or "at_restart")."""
    return {"at": trial.applied_at, "change": trial.change.to_json(), "describe": trial.change.describe(),
            "reason": trial.reason, "profile": trial.profile, "when": when, "before": figures(trial.before),
            "after": None, "result": ON_TRIAL, "detail": ""}


def outcome(result: Verdict) -> str:
    return "kept" if result is Verdict.KEEP else "rolled_back"


def closed(last: Mapping[str, Any] | None, trial: Trial, result: Verdict, after: Window | None,
           detail: str) -> tuple[dict[str, Any], bool]:
    """The trial's entry with its result, and whether it replaces `last` (the entry opened for it) rather
    than being a new one (a trial resumed from a state file whose entry is gone or another's)."""
    same = last is not None and last.get("result") == ON_TRIAL and last.get("change") == trial.change.to_json()
    base: dict[str, Any] = dict(last) if same and last is not None else {
        "at": trial.applied_at, "change": trial.change.to_json(), "describe": trial.change.describe(),
        "reason": trial.reason, "profile": trial.profile, "before": figures(trial.before)}
    base.update(after=figures(after) if after is not None else None, result=outcome(result), detail=detail)
    return base, same


def with_rolled_back(rolled: Mapping[str, Sequence[Any]], profile: str,
                     change: FlagChange) -> dict[str, list[Any]]:
    """`rolled` with `change` rolled back for `profile`: MAX_ROLLED_BACK per profile, and as many
    profiles as the learned ones (the oldest go first)."""
    out = {key: list(items) for key, items in rolled.items()}
    out.setdefault(profile, []).append(change.to_json())
    out[profile] = out[profile][-MAX_ROLLED_BACK:]
    return {key: out[key] for key in list(out)[-MAX_LEARNED_PROFILES:]}
