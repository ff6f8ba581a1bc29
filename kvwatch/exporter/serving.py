"""Stalls and KV pressure of an engine kvwatch did not start (`kvwatch export`).

The same pure decisions as under `kvwatch run` (watchdog/progress.py, watchdog/pressure_watch.py), fed
by the watch loop's own read of the engine each interval (under `kvwatch run` the supervisor judges and
this is not used). What they find goes into the engine's status, and is exported as under run:
- a stall is counted once as a `stalled` failure (kvwatch_engine_failures_total, so KvwatchEngineStalled
  fires on it) and its evidence is the status's `ending` while it lasts: readiness 503 and the reason,
  until a counter moves again (nobody restarts an engine kvwatch did not start);
- the recommendation is kvwatch_recommendation_info and its expected figures (KvwatchKvPressure).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from kvwatch.boundary.engine_http import EngineMetrics
from kvwatch.engine_status import EngineStatus
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.plan import Plan
from kvwatch.policy import Policy
from kvwatch.watchdog.config import EngineConfig
from kvwatch.watchdog.pressure_watch import PressureWatch
from kvwatch.watchdog.pressure_window import LoadSample
from kvwatch.watchdog.progress import Reading, Watch, observe

_LOG = logging.getLogger(__name__)
STALLED = FailureKind.STALLED.value


class ServingJudge:
    """One external engine's progress and load, judged at each of the watch loop's reads."""

    def __init__(self, name: str, stall_timeout: float = EngineConfig.stall_timeout_seconds,
                 pressure_window: float = EngineConfig.pressure_window_seconds,
                 fixed_flags: tuple[str, ...] = Policy().fixed_flags,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.stall_timeout = stall_timeout
        self._fixed = fixed_flags
        self._clock = clock
        self._progress = Watch()
        self._pressure = PressureWatch(pressure_window)
        self._stalls = 0
        self._stall: str | None = None       # the evidence while the engine stays stalled

    def observe(self, metrics: EngineMetrics | None, plan: Plan | None, settings: EngineSettings | None,
                replan: Callable[[FlagChange], Plan | None], gpu_free_bytes: int | None = None,
                cpu_seconds: float | None = None) -> None:
        """One read of the engine (None or not ok: it did not answer, nothing is judged)."""
        if metrics is None or not metrics.ok:
            return
        now, load = self._clock(), metrics.load
        self._progress, stall = observe(self._progress, Reading(now, load.running, load.prompt_tokens,
                                                                load.generation_tokens, cpu_seconds),
                                        self.stall_timeout)
        if stall is not None and self._stall is None:
            self._stalls += 1
            _LOG.warning("engine %s: stalled: %s", self.name, stall.evidence)
        elif stall is None and self._stall is not None:
            _LOG.info("engine %s: progress again", self.name)
        self._stall = stall.evidence if stall is not None else None
        self._pressure.observe(LoadSample(now, load.preemptions, metrics.kv_cache_usage_ratio, load.waiting,
                                          load.request_tokens, load.requests, load.prompt_buckets,
                                          load.generation_buckets, load.generation_tokens))
        if settings is None:
            return
        if self._pressure.judge(now, plan, settings, gpu_free_bytes, replan, self._fixed):
            found = self._pressure.recommendation
            if found is not None:
                _LOG.warning("engine %s: pressure: %s: recommend %s (KV tokens %s -> %s)", self.name, found.reason,
                             found.change.describe(), f"{found.tokens_before:,}", f"{found.tokens_after:,}")
            else:
                _LOG.info("engine %s: pressure: no KV pressure now; no recommendation", self.name)

    def status(self, status: EngineStatus) -> EngineStatus:
        """`status` with what was judged: the stalls counted, the stall's evidence, the recommendation."""
        failures = dict(status.failures)
        if self._stalls:
            failures[STALLED] = failures.get(STALLED, 0) + self._stalls
        return replace(status, failures=failures,
                       last_failure=STALLED if self._stalls else status.last_failure,
                       ending=f"{STALLED}: {self._stall}" if self._stall is not None else status.ending,
                       recommendation=self._pressure.recommendation)
