"""When a KV-pressure recommendation is applied, and whether it is kept (pure).

`[autopilot] apply` says when kvwatch may change the engine's flags by itself:

- ``never`` (the default): recommend only (the metric, `kvwatch status`, the alert);
- ``at_restart``: at the next restart kvwatch makes anyway (a failure, a stall);
- ``window``: also inside a daily window (``window = "02:00-04:00"``, UTC), with the engine drained
  first (readiness 503, then up to ``drain_timeout_seconds`` for running requests to finish).

One change at a time, at most ``max_changes_per_day`` in any 24 hours. After a change the same
signals are read over the next ``measure_seconds`` of serving and compared with the window before
it: the change is kept when preemptions per minute fell and generated tokens per second did not
fall by more than KEEP_THROUGHPUT; otherwise it is rolled back (the engine relaunched without it)
and never tried again for that profile. A failure of the engine on trial rolls it back at that restart.
Never a flag of policy.fixed_flags: those changes are only recommended. The supervisor acts on these
decisions (drain, relaunch, state file; docs/serving.md "The autopilot").
"""
from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.pressure import Window

KEEP_THROUGHPUT = 0.9          # generated tokens/s after / before at least this
DAY_SECONDS = 86_400.0


class Apply(enum.Enum):
    NEVER = "never"
    AT_RESTART = "at_restart"
    WINDOW = "window"


@dataclass(frozen=True)
class AutopilotConfig:
    apply: Apply = Apply.NEVER
    window: str | None = None            # "HH:MM-HH:MM" UTC; may wrap midnight ("23:00-01:00")
    drain_timeout_seconds: float = 120.0
    measure_seconds: float = 600.0
    max_changes_per_day: int = 1


class Verdict(enum.Enum):
    KEEP = "keep"
    ROLL_BACK = "roll_back"


_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


def parse_window(text: str) -> tuple[int, int]:
    """'02:00-04:00' -> minutes of the day (120, 240); ValueError otherwise."""
    m = _WINDOW.match(text.strip())
    if not m or m.group(1, 2) == m.group(3, 4):
        raise ValueError(f"autopilot window {text[:40]!r}: expected HH:MM-HH:MM (UTC), start != end")
    return int(m[1]) * 60 + int(m[2]), int(m[3]) * 60 + int(m[4])


def in_window(window: str, epoch_seconds: float) -> bool:
    start, end = parse_window(window)
    minute = int(epoch_seconds // 60) % (24 * 60)
    return start <= minute < end if start < end else (minute >= start or minute < end)


def may_apply(config: AutopilotConfig, now: float, applied_at: Sequence[float], trial_running: bool,
              restarting: bool) -> bool:
    """Whether a standing recommendation may be applied now (`now` and `applied_at`: epoch seconds)."""
    if config.apply is Apply.NEVER or trial_running:
        return False
    if sum(1 for t in applied_at if now - t < DAY_SECONDS) >= config.max_changes_per_day:
        return False
    if restarting:
        return True
    return config.apply is Apply.WINDOW and config.window is not None and in_window(config.window, now)


def verdict(before: Window, after: Window) -> Verdict:
    """Kept when it relieved the pressure and did not cost throughput; rolled back otherwise."""
    relieved = after.preemptions_per_minute < before.preemptions_per_minute or (
        before.preemptions_per_minute == 0 and (after.waiting or 0) < (before.waiting or 0))
    tps_before, tps_after = before.tokens_per_second, after.tokens_per_second
    cost = tps_before is not None and tps_after is not None and tps_after < KEEP_THROUGHPUT * tps_before
    return Verdict.KEEP if relieved and not cost else Verdict.ROLL_BACK


def drained(running: float | None, waiting: float | None, waited: float, timeout: float) -> bool:
    """Whether the drain before a relaunch is over: no request running or waiting in the engine's own
    series, or `timeout` seconds waited (an unreadable series waits the timeout out)."""
    if waited >= timeout:
        return True
    return running is not None and running <= 0 and (waiting or 0) <= 0


def applicable(change: FlagChange, fixed: Sequence[str], rolled_back: Sequence[FlagChange]) -> bool:
    """Never a flag a fleet's routing depends on (policy.fixed_flags: recommended only), never a change
    that was rolled back for this profile."""
    return not any(flag in change for flag in fixed) and change not in rolled_back


def comparable(before: Window | None, window_seconds: float) -> bool:
    """A window to compare a change with: nearly the whole pressure window (a short one is mostly noise)."""
    return before is not None and before.seconds >= 0.8 * window_seconds


def measured(trial: Trial, now: float, measure_seconds: float, after: Window | None) -> Verdict | None:
    """The trial's verdict once the engine served `measure_seconds` with the change (None: not yet)."""
    if trial.serving_since is None or after is None or now - trial.serving_since < measure_seconds:
        return None
    if after.seconds < 0.8 * measure_seconds:   # the window must cover the time measured
        return None
    return verdict(trial.before, after)


def figures(window: Window) -> dict[str, float | None]:
    """A window as the state file, `kvwatch status` and the log show it."""
    tps = window.tokens_per_second
    return {"seconds": round(window.seconds, 1), "preemptions_per_minute": round(window.preemptions_per_minute, 2),
            "tokens_per_second": round(tps, 2) if tps is not None else None,
            "kv_usage": round(window.kv_usage, 3) if window.kv_usage is not None else None,
            "waiting": round(window.waiting, 2) if window.waiting is not None else None}


def compared(before: Window, after: Window) -> str:
    """'preemptions/min 12.0 -> 0.0, tokens/s 30.1 -> 28.7'."""
    def tps(w: Window) -> str:
        return f"{w.tokens_per_second:.1f}" if w.tokens_per_second is not None else "?"
    return (f"preemptions/min {before.preemptions_per_minute:.1f} -> {after.preemptions_per_minute:.1f}, "
            f"tokens/s {tps(before)} -> {tps(after)}")


@dataclass(frozen=True)
class Trial:
    """A change applied and being measured."""
    change: FlagChange
    applied_at: float            # epoch seconds
    serving_since: float | None  # monotonic: the engine's READY with the change (measure from then)
    before: Window
    before_argv: tuple[str, ...] = ()   # the plan before the change: what a roll-back relaunches
    profile: str = ""                   # the profile (learned_key) the change was tried for
    reason: str = ""                    # the recommendation's reason

    def to_json(self) -> dict[str, object]:
        return {"change": self.change.to_json(), "applied_at": self.applied_at, "before": asdict(self.before),
                "before_argv": list(self.before_argv), "profile": self.profile, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Trial:
        """From to_json()'s form (the state file); ValueError or TypeError on anything else."""
        before = data["before"]
        if not isinstance(before, Mapping):
            raise ValueError("autopilot trial: 'before' is not a window")
        argv = data["before_argv"]
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not argv:
            raise ValueError("autopilot trial: 'before_argv' is not a command")
        return cls(FlagChange.from_json(data["change"]), float(data["applied_at"]), None,
                   Window(**{k: v for k, v in before.items() if k in _WINDOW_FIELDS}), tuple(argv),
                   str(data.get("profile", "")), str(data.get("reason", "")))


_WINDOW_FIELDS = frozenset(f.name for f in fields(Window))
