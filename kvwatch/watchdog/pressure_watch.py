"""The engine's load while it serves, and the KV-pressure recommendation it leads to (pure).

The supervisor hands over the engine's series at each good probe of a READY engine; every
`every_seconds` the window (pressure_window.window_of) is judged and the planner's recommender
(planner/pressure.recommend) chooses one flag change or none. Samples are bounded (`MAX_SAMPLES`).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.plan import Plan
from kvwatch.planner.pressure import Recommendation, Window, recommend
from kvwatch.watchdog.pressure_window import LoadSample, window_of

MAX_SAMPLES = 4096
EVERY_SECONDS = 30.0


class PressureWatch:
    def __init__(self, window_seconds: float, every_seconds: float | None = None) -> None:
        self.window_seconds = window_seconds
        # judged every EVERY_SECONDS, or twice a window when the window is shorter than that
        self.every_seconds = every_seconds if every_seconds is not None else min(EVERY_SECONDS, window_seconds / 2)
        self._samples: deque[LoadSample] = deque(maxlen=MAX_SAMPLES)
        self._judged_at: float | None = None
        self.recommendation: Recommendation | None = None

    def reset(self) -> None:
        """A new launch: its counters start again, and so does the window."""
        self._samples.clear()
        self._judged_at = None

    def observe(self, sample: LoadSample) -> None:
        self._samples.append(sample)

    def window(self, seconds: float) -> Window | None:
        """The engine's load over the last `seconds` of this launch (the autopilot's before and after)."""
        return window_of(list(self._samples), seconds)

    def judge(self, now: float, plan: Plan | None, settings: EngineSettings, gpu_free_bytes: int | None,
              replan: Callable[[FlagChange], Plan | None], fixed: Sequence[str] = (),
              tried: Sequence[FlagChange] = ()) -> bool:
        """Judge the window when it is due; True when the recommendation changed."""
        if self._judged_at is not None and now - self._judged_at < self.every_seconds:
            return False
        self._judged_at = now
        window = window_of(list(self._samples), self.window_seconds, gpu_free_bytes)
        found = None
        if plan is not None and window is not None and window.seconds >= min(self.window_seconds, self.every_seconds):
            found = recommend(plan, settings, window, replan, fixed, tried)
        previous = self.recommendation
        changed = (found.change if found else None) != (previous.change if previous else None)
        if found is not None and previous is not None and not changed:
            # The same change still stands: its reason stays the one it was made for. The reason is a
            # label of kvwatch_recommendation_info; a rate that moved with each judgement would make a
            # new series each time and reset KvwatchKvPressure's `for:`, so the alert would never fire.
            found = replace(found, reason=previous.reason)
        self.recommendation = found
        return changed
