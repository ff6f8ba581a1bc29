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
and never tried again for that profile.
"""
from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Trial:
    """A change applied and being measured."""
    change: FlagChange
    applied_at: float            # epoch seconds
    serving_since: float | None  # monotonic: the engine's READY with the change (measure from then)
    before: Window
