"""The autopilot's driver ([autopilot]): judge KV pressure while the engine serves, put the standing
recommendation on trial, measure it, keep it or roll it back, and drain the engine before a relaunch.

When and whether are autopilot.py's pure decisions, what the state file keeps is autopilot_record.py's,
and the command to relaunch with is next_command.py's; this class holds the trial and the relaunch
between ticks and writes the record. The supervisor owns the engine: it asks `step` at each read of a
READY engine, drains (`drain`) and relaunches when told to, and switches to the command it is handed.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from kvwatch.boundary.engine_http import EngineLoad, EngineMetrics
from kvwatch.errors import KvwatchError
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.plan import Plan
from kvwatch.planner.pressure import Recommendation, Window
from kvwatch.watchdog import autopilot, autopilot_record
from kvwatch.watchdog.autopilot import Apply, Trial, Verdict
from kvwatch.watchdog.config import Config
from kvwatch.watchdog.launch_watch import LaunchEnd
from kvwatch.watchdog.next_command import Applied, Next, RolledBack, next_command
from kvwatch.watchdog.outcomes import LaunchOutcome
from kvwatch.watchdog.plan_in_force import PlanInForce
from kvwatch.watchdog.preflight import learned_key
from kvwatch.watchdog.pressure_watch import PressureWatch
from kvwatch.watchdog.pressure_window import LoadSample
from kvwatch.watchdog.state_store import EngineRecord

_LOG = logging.getLogger(__name__)


def profile_of(command: EngineCommand, planner: PlanInForce | None) -> str:
    """The profile a change is tried for (and rolled back for): the learned memory's key."""
    return (learned_key(command, planner.device) if planner is not None else None) or ""


class AutopilotController:
    def __init__(self, config: Config, pressure: PressureWatch, now: Callable[[], float],
                 wall_time: Callable[[], float], changed: Callable[[], None]) -> None:
        self._config = config
        self._pressure = pressure
        self._now = now
        self._wall_time = wall_time
        self._changed = changed   # the record changed: save the state file and publish the status
        self.trial: Trial | None = None      # the change being measured
        self._relaunch: Next | None = None   # the command to relaunch with, and why

    # -- KV pressure -----------------------------------------------------------------------

    def watch_pressure(self, metrics: EngineMetrics, record: EngineRecord, command: EngineCommand,
                       planner: PlanInForce | None, gpu_free: Callable[[], int | None]) -> None:
        """The engine's load into the pressure window; when the recommendation changes, say so (log,
        status, state file). Re-plans happen only under pressure, at most every EVERY_SECONDS."""
        load, now = metrics.load, self._now()
        self._pressure.observe(LoadSample(now, load.preemptions, metrics.kv_cache_usage_ratio, load.waiting,
                                          load.request_tokens, load.requests, load.prompt_buckets,
                                          load.generation_buckets, load.generation_tokens))
        if planner is None:
            return
        try:
            settings = command.settings()
        except KvwatchError:
            return
        free = gpu_free() if planner.device.platform == "cuda" else None

        def replan(change: FlagChange) -> Plan | None:
            return planner.what_if(change.apply(command), record.learned_non_kv)

        # A change to a fixed flag is recommended like any other; the autopilot never applies it.
        if not self._pressure.judge(now, planner.plan, settings, free, replan, (),
                                    autopilot_record.rolled_back(record.autopilot_rolled_back, profile_of(command, planner))):
            return
        found = self._pressure.recommendation
        if found is not None:
            _LOG.warning("pressure: %s: recommend %s (KV tokens %s -> %s)", found.reason, found.change.describe(),
                         f"{found.tokens_before:,}", f"{found.tokens_after:,}")
        else:
            _LOG.info("pressure: no KV pressure now; no recommendation")
        record.recommendation = found.to_json() if found is not None else {}
        self._changed()

    # -- the trial -------------------------------------------------------------------------

    def resume(self, record: EngineRecord, where: str) -> None:
        """A trial the last kvwatch left open goes on: measured again from this launch's READY."""
        data = record.autopilot_trial
        if not data:
            return
        try:
            self.trial = Trial.from_json(data)
        except (KeyError, ValueError, TypeError, AttributeError):
            _LOG.warning("autopilot: the trial in %s is unreadable; forgotten", where)
            record.autopilot_trial = {}
            return
        _LOG.info("autopilot: %s is still on trial; measured again once serving", self.trial.change.describe())

    def step(self, record: EngineRecord, command: EngineCommand, planner: PlanInForce | None) -> LaunchEnd | None:
        """At each read of a READY engine's series: conclude the trial once measured, or, in the window,
        begin one with the standing recommendation. A LaunchEnd when the engine is to be relaunched."""
        cfg = self._config.autopilot
        trial = self.trial
        if trial is not None:
            now = self._now()
            if trial.serving_since is None:
                self.trial = trial = replace(trial, serving_since=now)
            after = self._pressure.window(cfg.measure_seconds)
            result = autopilot.measured(trial, now, cfg.measure_seconds, after)
            if result is None:
                return None
            self._conclude(record, command, trial, result, after)
            return LaunchEnd(LaunchOutcome.AUTOPILOT, self._relaunch.reason, served=True) if self._relaunch else None
        found = self._pressure.recommendation
        if cfg.apply is Apply.NEVER or found is None:
            return None
        if not autopilot.may_apply(cfg, self._wall_time(), autopilot_record.applied_times(record.autopilot_changes),
                                   False, restarting=False):
            return None
        if not self._begin(record, command, profile_of(command, planner), found, "window"):
            return None
        assert self._relaunch is not None
        return LaunchEnd(LaunchOutcome.AUTOPILOT, self._relaunch.reason, served=True)

    def at_restart(self, record: EngineRecord, command: EngineCommand, planner: PlanInForce | None) -> Next | None:
        """A restart kvwatch makes anyway (the same plan): the standing recommendation goes with it; the
        command to switch to, when it does."""
        found = self._pressure.recommendation
        if found is None or self.trial is not None:
            return None
        if autopilot.may_apply(self._config.autopilot, self._wall_time(),
                               autopilot_record.applied_times(record.autopilot_changes), False,
                               restarting=True) and self._begin(record, command, profile_of(command, planner), found, "at_restart"):
            return self.take_relaunch()
        return None

    def failed(self, record: EngineRecord, command: EngineCommand, kind: str) -> Next | None:
        """The engine failed: a change on trial did not survive it; the command before it, if one was."""
        if self.trial is None:
            return None
        self._conclude(record, command, self.trial, Verdict.ROLL_BACK, None,
                       f"the engine failed ({kind}) during the trial")
        return self.take_relaunch()

    def drain(self, read: Callable[[float], EngineMetrics | None], stopped: Callable[[], bool],
              exited: Callable[[], bool], wait: Callable[[float], bool]) -> bool:
        """Drain the engine before a relaunch (`read`: its /metrics within a timeout, `wait`: one interval,
        True on a stop request); True when a stop was requested meanwhile."""
        interval = self._config.engine.health_interval_seconds

        def load() -> EngineLoad | None:
            metrics = read(max(1.0, min(5.0, interval)))
            return metrics.load if metrics is not None else None

        return drain(load, stopped, exited, lambda: wait(min(1.0, interval)), self._now,
                     self._config.autopilot.drain_timeout_seconds)

    def take_relaunch(self) -> Next:
        relaunch, self._relaunch = self._relaunch, None
        assert relaunch is not None
        return relaunch

    def _begin(self, record: EngineRecord, command: EngineCommand, profile: str, found: Recommendation,
               when: str) -> bool:
        """Put the recommendation on trial: measured against the window before it. False when it may not
        be (a fixed flag, rolled back before for this profile, no window to compare with)."""
        window_seconds = self._config.engine.pressure_window_seconds
        before = self._pressure.window(window_seconds)
        rolled = autopilot_record.rolled_back(record.autopilot_rolled_back, profile)
        if not autopilot.comparable(before, window_seconds) or \
                not autopilot.applicable(found.change, self._config.policy.fixed_flags, rolled):
            return False
        assert before is not None
        trial = Trial(found.change, self._wall_time(), None, before, command.argv, profile, found.reason)
        self.trial = trial
        record.autopilot_trial = trial.to_json()
        record.autopilot_changes.append(autopilot_record.opened(trial, when))
        record.autopilot_counts["applied"] = record.autopilot_counts.get("applied", 0) + 1
        _LOG.warning("autopilot: applying %s (%s; %s); measured over %.0fs of serving", found.change.describe(),
                     found.reason, when.replace("_", " "), self._config.autopilot.measure_seconds)
        self._pressure.recommendation = None   # in force now, not a recommendation
        record.recommendation = {}
        self._relaunch = next_command(command, Applied(found.change))
        self._changed()
        return True

    def _conclude(self, record: EngineRecord, command: EngineCommand, trial: Trial, result: Verdict,
                  after: Window | None, detail: str = "") -> None:
        """The trial's end: kept, or rolled back (the plan before is relaunched; never tried again here)."""
        detail = detail or (autopilot.compared(trial.before, after) if after is not None else "")
        changes = record.autopilot_changes
        entry, same = autopilot_record.closed(changes[-1] if changes else None, trial, result, after, detail)
        if same:
            changes[-1] = entry
        else:
            changes.append(entry)
        outcome = autopilot_record.outcome(result)
        record.autopilot_counts[outcome] = record.autopilot_counts.get(outcome, 0) + 1
        record.autopilot_trial = {}
        self.trial = None
        if result is Verdict.KEEP:
            _LOG.warning("autopilot: kept %s: %s", trial.change.describe(), detail)
        else:
            _LOG.warning("autopilot: rolling back %s: %s", trial.change.describe(), detail)
            record.autopilot_rolled_back = autopilot_record.with_rolled_back(record.autopilot_rolled_back,
                                                                             trial.profile, trial.change)
            self._relaunch = next_command(command, RolledBack(trial.before_argv, trial.change))
        self._changed()


def drain(read: Callable[[], EngineLoad | None], stopped: Callable[[], bool], exited: Callable[[], bool],
          wait: Callable[[], bool], now: Callable[[], float], timeout: float) -> bool:
    """Wait for the engine's running and waiting requests to finish, up to `timeout` (its own series,
    `read`); True when a stop was requested meanwhile (`wait` waits one interval, True on a stop)."""
    start = now()
    while True:
        if stopped():
            return True
        if exited():
            return False
        load = read()
        waited = now() - start
        if autopilot.drained(load.running if load else None, load.waiting if load else None, waited, timeout):
            if load is not None and (load.running or 0) + (load.waiting or 0) > 0:
                _LOG.warning("autopilot: drain: %s requests still running, %s waiting after %.0fs",
                             f"{load.running:.0f}", f"{load.waiting or 0:.0f}", waited)
            else:
                _LOG.info("autopilot: drained in %.1fs", waited)
            return False
        if wait():
            return True
