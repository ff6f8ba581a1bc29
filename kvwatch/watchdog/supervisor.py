"""The watchdog: one engine as an explicit state machine (after supervisord's process.py).

    STOPPED -> STARTING -> READY           launched; READY once /health and /metrics answer
    STARTING | READY -> BACKOFF -> STARTING  a failure with a remedy left (same or corrected plan)
    STARTING | READY -> FATAL              no remedy, or the policy's budget is spent (exit 78)
    any running state -> STOPPING -> STOPPED, BACKOFF -> STOPPED   SIGTERM/SIGINT (exit 0)

Every transition goes through `_transition`, with its reason; it saves the state file, tells systemd
and publishes a fresh immutable EngineStatus (`status`, which the exporter polls). This module is the
loop; the rest is held: start-up (startup.py), the engine's processes (engine_processes.py), each
launch's memory (launch_memory.py), the autopilot (autopilot_controller.py), the status (status_view.py);
the command in force is next_command.py's, a tick's decisions launch_watch.py's, a failure's recovery.py's. Every OS call goes
through the injected WatchdogOs, time through the Clock, every wait on the stop Event.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import BinaryIO

from kvwatch.boundary.engine_http import EngineMetrics, EnginePage
from kvwatch.boundary.plan_loader import flags_release
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exitcodes import EXIT_GAVE_UP, EXIT_OK
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import RuleSet
from kvwatch.watchdog import disk_writer, leftovers, recovery, status_view
from kvwatch.watchdog.autopilot_controller import AutopilotController
from kvwatch.watchdog.budget import Budget
from kvwatch.watchdog.clock import Clock, MonotonicClock
from kvwatch.watchdog.config import Config
from kvwatch.watchdog.engine_processes import EngineProcesses, Running
from kvwatch.watchdog.launch_evidence import LaunchEvidence
from kvwatch.watchdog.launch_memory import LaunchMemory
from kvwatch.watchdog.launch_watch import (
    Event,
    LaunchEnd,
    LaunchState,
    Timing,
    after_probe,
    before_probe,
    died_in_log,
    probe_due,
)
from kvwatch.watchdog.memory_learning import MAX_LEARNED_PROFILES
from kvwatch.watchdog.next_command import Next, Recovered, Source, next_command
from kvwatch.watchdog.os_interface import RealOs, WatchdogOs, probe_engine, signal_name
from kvwatch.watchdog.outcomes import NO_KERNEL_RECORD, LaunchOutcome
from kvwatch.watchdog.plan_in_force import PlanInForce
from kvwatch.watchdog.preflight import device_for_spec
from kvwatch.watchdog.pressure_watch import PressureWatch
from kvwatch.watchdog.probe_pool import Probe, ProbePool
from kvwatch.watchdog.progress import Reading
from kvwatch.watchdog.reconcile import learned_rules
from kvwatch.watchdog.sd_notify import SdNotifier
from kvwatch.watchdog.startup import Startup
from kvwatch.watchdog.state_store import EngineLock, EngineRecord, StateStore

_LOG = logging.getLogger(__name__)
__all__ = ["EXIT_FLUSH_SECONDS", "MAX_LEARNED_PROFILES", "Clock", "MonotonicClock", "Observer", "Supervisor"]

EXIT_FLUSH_SECONDS = 2.0   # at exit, how long the last state file may take to reach the disk (then lost)

Observer = Callable[[EngineStatus], None]

_ALLOWED = {(old, new) for old, news in {   # the state machine's transitions, from each state
    EngineState.STOPPED: (EngineState.STARTING,),
    EngineState.STARTING: (EngineState.READY, EngineState.BACKOFF, EngineState.FATAL, EngineState.STOPPING),
    EngineState.READY: (EngineState.BACKOFF, EngineState.FATAL, EngineState.STOPPING),
    EngineState.BACKOFF: (EngineState.STARTING, EngineState.STOPPED),
    EngineState.STOPPING: (EngineState.STOPPED,),
}.items() for new in news}


class Supervisor:
    def __init__(self, config: Config, *, observers: Iterable[Observer] = (), clock: Clock | None = None,
                 device: Device | None = None, rules: RuleSet | None = None,
                 notifier: SdNotifier | None = None, output: BinaryIO | None = None,
                 environ: dict[str, str] | None = None,
                 probe: Probe | None = None,
                 budget: Budget | None = None, gpu_pids: Callable[[], list[tuple[str, int]]] | None = None,
                 os_interface: WatchdogOs | None = None) -> None:
        self.config = config
        self.name = config.name
        self._observers = list(observers)
        self._clock = clock or MonotonicClock()
        self._device = device
        self._rules = rules
        self._notifier = notifier or SdNotifier.from_env()
        self._output = output if output is not None else getattr(sys.stdout, "buffer", None)
        self._environ = dict(os.environ if environ is None else environ)
        self._os: WatchdogOs = os_interface or RealOs()
        self._probes = ProbePool(probe or probe_engine)
        self._ending: str | None = None   # why a served launch ended while its engine is being stopped
        self._pressure = PressureWatch(config.engine.pressure_window_seconds)   # KV pressure while serving
        self._budget = budget or Budget(config.policy)
        self._store = StateStore(config.state_dir, config.name, writer=disk_writer.shared())  # never waits on disk
        self._lock = EngineLock(config.state_dir, config.name)
        self._stop = threading.Event()
        self._wake = threading.Event()   # the watch loop's alarm: a stop request or the engine's exit
        self._stop_reason = ""
        self._state = EngineState.STOPPED
        self._reason = "not started"
        self._record = EngineRecord(name=config.name)
        self._command = EngineCommand.parse(config.engine.command, flags_release(self._os.installed_vllm()))
        self._planner: PlanInForce | None = None   # from the start on: the plan in force
        self._running: Running | None = None
        self._ready_sent = False
        self._spawn_error: str | None = None
        self._procs = EngineProcesses(config, self._os, lambda: self._running, lambda: self._record,
                                      lambda: self._device, self._clock.now, self._sleep, self._save_and_publish,
                                      gpu_pids)
        self._evidence = LaunchEvidence(self._os, lambda: self._procs.gpu_view().snapshot())
        self._autopilot = AutopilotController(config, self._pressure, self._clock.now, self._os.wall_time,
                                              self._save_and_publish)
        self._page: EnginePage | None = None   # the last look at the running engine (the exporter's too)
        self._memory = LaunchMemory(config, self._os, lambda: self._procs.gpu_view().foreign_bytes(), self._engine_env)
        self._starter = Startup(config, self._os, str(self._store.path), self._engine_env)
        self._status = self._make_status()

    # -- public ------------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def status(self) -> EngineStatus:
        return self._status

    @property
    def engine_page(self) -> EnginePage | None:
        """The last look at the running engine (/health, and /metrics while READY); None while none runs.
        One reference, an immutable value: the exporter reads it instead of reading the engine again."""
        return self._page

    @property
    def command(self) -> EngineCommand:
        return self._command

    def request_stop(self, reason: str = "stop requested") -> None:
        """Thread-safe; call it from the thread that handles SIGTERM/SIGINT."""
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()
            self._wake.set()

    def run(self) -> int:
        """Supervise until stopped (EXIT_OK) or FATAL (EXIT_GAVE_UP). Spawns from this thread,
        which must live as long as the engine (PR_SET_PDEATHSIG follows the spawning thread)."""
        self._store.ensure_dir()
        self._lock.acquire()
        self._store.remove_stale_temporaries()
        try:
            self._startup()
            return self._loop()
        finally:
            if self._running is not None:  # an unexpected error: never leave the engine behind
                self._end_engine()
            if not disk_writer.flush_all(EXIT_FLUSH_SECONDS):   # the state file, the learned profile, the lock
                _LOG.warning("state: %s not written at exit (the disk does not answer)", self._store.path)
            self._lock.release()

    # -- the state machine -------------------------------------------------------------

    def _transition(self, new: EngineState, reason: str) -> None:
        old = self._state
        if (old, new) not in _ALLOWED:
            raise RuntimeError(f"illegal transition {old.value} -> {new.value} ({reason})")
        self._state, self._reason = new, reason
        _LOG.info("state: %s -> %s: %s", old.value, new.value, reason)
        self._record.state, self._record.reason = new.value, reason
        self._save()
        line = f"{self.name}: {new.value}: {reason}"
        if new is EngineState.READY and not self._ready_sent:
            self._notifier.ready(line)
            self._ready_sent = True
        elif new is EngineState.STOPPING:
            self._notifier.stopping(line)
        else:
            self._notifier.status(line)
        self._publish()

    def _loop(self) -> int:
        while True:
            self._procs.clean_leftovers(self._command)
            if self._stop.is_set():  # asked to stop before (or while cleaning up for) the first launch
                if self._state is EngineState.BACKOFF:
                    self._transition(EngineState.STOPPED, f"{self._stop_reason} during backoff")
                return EXIT_OK
            self._launch()
            end = self._watch()
            if end.outcome is LaunchOutcome.AUTOPILOT:
                if not self._autopilot_relaunch():
                    continue
                end = LaunchEnd(LaunchOutcome.STOP)   # asked to stop while draining
            if end.outcome is LaunchOutcome.STOP:
                self._transition(EngineState.STOPPING, self._stop_reason)
                self._end_engine()
                self._transition(EngineState.STOPPED, f"{self._stop_reason}: engine stopped")
                return EXIT_OK
            if end.served and end.outcome in (LaunchOutcome.HANG, LaunchOutcome.STALLED):   # serves nothing:
                _LOG.warning("launch ended: %s: %s", end.outcome.value, end.detail)   # readiness says so now
                self._ending = f"{end.outcome.value}: {end.detail}"
                self._publish()
                end = self._evidence.with_stacks(end, self._running, self._command)   # a stall's stacks
            self._end_engine()
            delay = self._after_failure(end)
            if delay is None:
                return EXIT_GAVE_UP
            self._wait_gpu_release()
            if self._wait(delay):
                self._transition(EngineState.STOPPED, f"{self._stop_reason} during backoff")
                return EXIT_OK

    def _wait(self, seconds: float) -> bool:
        """Wait on the stop Event, feeding systemd's watchdog: True when a stop was requested."""
        deadline = self._clock.now() + seconds
        while True:
            now = self._clock.now()
            self._notifier.watchdog(now)
            if now >= deadline:
                return self._stop.is_set()
            if self._clock.wait(self._stop, min(deadline - now, 1.0)):
                return True

    def _sleep(self, seconds: float) -> None:
        """A short pause inside a step (stopping a group): the loop is still alive, say so."""
        self._clock.sleep(seconds)
        self._notifier.watchdog(self._clock.now())

    # -- start ---------------------------------------------------------------------------

    def _startup(self) -> None:
        start = self._starter.reconcile(self._store.load(), self._command, self._record)
        self._record, self._command = start.record, start.command
        self._memory.note_upgrade(start.upgrade)
        self._autopilot.resume(self._record, str(self._store.path))
        if self._device is None:
            self._device = device_for_spec(self.config.device)
        self._planner, self._command = self._starter.plan(self._record, self._command, self._device, self._rules,
                                                          lambda: self._procs.gpu_view().context())
        self._save()
        self._publish()

    @property
    def _plan(self) -> Plan | None:
        return self._planner.plan if self._planner is not None else None

    def _engine_env(self) -> dict[str, str]:
        return leftovers.engine_env(self._environ, self.config.engine.environment, self.config.state_dir, self.name)

    def _launch(self) -> None:
        planner = self._planner
        assert planner is not None
        self._ending = None
        self._pressure.reset()
        argv = self._memory.prepare(self._command, planner, self._record)
        if argv not in self._record.plans_tried:
            self._record.plans_tried.append(argv)
        self._transition(EngineState.STARTING, f"launching: {' '.join(argv)}")
        self._evidence.before_launch()
        started = self._procs.spawn(argv, self._engine_env(), self._output, self._wake.set)
        self._running, self._spawn_error = (started, None) if isinstance(started, Running) else (None, started)
        self._procs.refresh_tree(force=True)

    # -- watch ---------------------------------------------------------------------------

    def _watch(self) -> LaunchEnd:
        """Watch the running launch until it ends; each tick's decisions are launch_watch's."""
        run = self._running
        if run is None:
            return LaunchEnd(LaunchOutcome.SPAWN_FAILED, self._spawn_error or "spawn failed")
        cfg = self.config.engine
        timing = Timing(cfg.health_interval_seconds, cfg.start_timeout_seconds, cfg.hang_timeout_seconds,
                        self.config.policy.stable_seconds, cfg.stall_timeout_seconds)
        url = self._command.health_url()
        state = LaunchState.at_launch(run.started)

        def died(since_line: int) -> str | None:
            return died_in_log(run.pump.lines_since(since_line))

        while True:
            now = self._clock.now()
            end = before_probe(state, self._stop.is_set(), run.proc.poll())
            if end is not None:
                return end
            if probe_due(state, now):
                probed = self._probes.ask(url, timing.probe_timeout, not state.ready,
                                          interrupted=lambda: self._stop.is_set() or run.proc.poll() is not None,
                                          waiting=lambda: self._notifier.watchdog(self._clock.now()))
                if probed is None:
                    continue   # a stop request or the engine's exit came first: handled at the top
                self._procs.refresh_tree()  # before a transition, so its status carries the current pids
                page = self._read_engine(url, timing.probe_timeout, run) if probed and state.ready else None
                self._page = EnginePage(probed, page)
                metrics = page if page is not None and page.ok else None
                reading = Reading(self._clock.now(), metrics.load.running, metrics.load.prompt_tokens,
                                  metrics.load.generation_tokens, self._procs.compute_seconds(run)) \
                    if metrics is not None else None   # the engine's counters for the stall detector
                now = self._clock.now()
                state, event, end = after_probe(state, probed, now, timing, run.pump.lines_seen, died,
                                                reading)
                if metrics is not None and end is None:
                    self._autopilot.watch_pressure(metrics, self._record, self._command, self._planner,
                                                   self._procs.gpu_free)
                    end = self._autopilot.step(self._record, self._command, self._planner)
                if event is Event.READY:
                    self._transition(EngineState.READY, f"serving on {url} after {now - run.started:.0f}s")
                elif event is Event.STABLE:
                    self._budget.stable()
                    _LOG.info("stable: READY for %.0fs; backoff reset", now - (state.ready_since or now))
                if end is not None:
                    return end
            elif run.tree.ranks.cores:
                self._procs.refresh_tree()  # DP engine cores: every tick, to see which one dies first
            self._refresh_facts()
            end = self._host_memory_step(run, state.ready)
            if end is not None:
                return end
            self._procs.reap_orphans()
            if not run.proc.reaper_alive():
                _LOG.warning("reaper: gone; starting a new one")
                run.proc.start_reaper()
            self._notifier.watchdog(self._clock.now())
            self._clock.wait(self._wake, timing.tick)  # wakes at once on a stop request or the engine's exit
            self._wake.clear()

    def _read_engine(self, url: str, timeout: float, run: Running) -> EngineMetrics | None:
        """The engine's /metrics, read on the probe pool with the probe's deadline (None: not read)."""
        return self._probes.read(lambda: self._os.scrape(url, timeout),
                                 interrupted=lambda: self._stop.is_set() or run.proc.poll() is not None,
                                 waiting=lambda: self._notifier.watchdog(self._clock.now()))

    def _switch_to(self, nxt: Next, save: bool = True) -> None:
        """The command in force is now `nxt`'s (next_command.py decided it), and the plan in force its."""
        assert nxt.command is not None
        self._command = nxt.command
        self._record.argv = list(nxt.command.argv)
        if self._planner is not None:
            self._planner.compute(nxt.command, self._record.learned_non_kv)
        if save:
            self._save()

    def _autopilot_relaunch(self) -> bool:
        """Drain the serving engine (readiness 503, running requests finish), stop it and relaunch it
        with the autopilot's command. True when a stop was requested while draining."""
        nxt = self._autopilot.take_relaunch()
        self._ending = f"autopilot: draining to {nxt.reason}"
        self._publish()   # readiness 503 from now on
        if self._drain():   # asked to stop: the next kvwatch launches the new command (and resumes its trial)
            self._switch_to(nxt)
            return True
        self._end_engine()
        self._running = None
        self._switch_to(nxt)
        self._transition(EngineState.BACKOFF, f"autopilot: {nxt.reason}; relaunch now")
        return False

    def _drain(self) -> bool:
        run, url = self._running, self._command.health_url()
        if run is None:
            return False
        return self._autopilot.drain(lambda timeout: self._read_engine(url, timeout, run), self._stop.is_set,
                                     lambda: run.proc.poll() is not None, self._wait)

    def _refresh_facts(self) -> None:
        run = self._running
        if run is not None and self._memory.note_facts(run.pump.facts, self._record, self._command, self._planner):
            self._save()
            self._publish()

    def _host_memory_step(self, run: Running, served: bool) -> LaunchEnd | None:
        """Stop the engine before host memory wedges the host; the record of it is written first, so the
        next start re-plans even after a reboot."""
        stop = self._evidence.host_memory_stop(run.pump.lines, list(self._command.argv))
        if stop is None:
            return None
        self._record.host_memory_stops.append(stop)
        self._save()
        disk_writer.shared().flush(2.0)   # on disk before the stop, but never waiting long on a frozen one
        _LOG.error("host memory: %s: stopping the engine group before the host wedges", stop.reason)
        return LaunchEnd(LaunchOutcome.HOST_MEMORY, f"stopped by kvwatch before host memory ran out: "
                         f"{stop.reason}", served=served)

    def _wait_gpu_release(self) -> None:
        """Before a relaunch: until the dead engine's GPU memory is released (bounded), said and exported."""
        if self._evidence.wait_gpu_release(self._procs.last_pids, self._clock.now, self._sleep,
                                           self._stop.is_set) is not None:
            self._publish()

    def _end_engine(self) -> None:
        run = self._running
        if run is None or run.ended:
            return
        run.ended = True
        self._page = None
        self._procs.end(run)
        self._save()
        self._publish()

    # -- failure -------------------------------------------------------------------------

    def _after_failure(self, end: LaunchEnd) -> float | None:
        """Diagnose, pick the remedy, count it: the backoff delay, or None after going FATAL."""
        run, self._running = self._running, None
        record = self._record
        lost = next(iter(run.tree.ranks.lost.items()), None) if run is not None else None
        kernel = self._evidence.kernel_record() if end.outcome in recovery.KERNEL_RECORDED else NO_KERNEL_RECORD
        signal = signal_name(end.returncode) if end.outcome is LaunchOutcome.EXIT else ""
        diagnosis, failure = recovery.launch_failure(end, run.said_before_stop() if run else [], lost, kernel, record.failures,
                                                     self._command, self._os.wall_time(), signal)
        if diagnosis.kind is FailureKind.PORT_IN_USE:   # fatal only while a process still listens on it
            port = self._command.settings().port
            diagnosis = recovery.port_verdict(diagnosis, port, self._os.port_listeners(port))
            failure = dataclasses.replace(failure, evidence=diagnosis.evidence)
        kind = failure.kind.value   # the counters' keys: the metrics' label values
        _LOG.warning("failed: %s (%s): %s", kind, end.detail, failure.evidence)
        record.failure_counts[kind] = record.failure_counts.get(kind, 0) + 1
        record.failures.append(failure)

        rolled_back = self._autopilot.failed(record, self._command, kind)   # the plan before the trial again
        if rolled_back is not None:
            self._switch_to(rolled_back)
        planner = self._planner
        now = self._clock.now()
        budget = recovery.BudgetState(self._budget.restart_refusal(now), self._budget.correction_refusal())
        decision = recovery.decide(
            diagnosis, self._command, detail=end.detail, tried=recovery.tried_plans(record.failures),
            budget=budget, policy=self.config.policy, plan=self._plan, gpu=self._procs.gpu_view().context(),
            rules=planner.rules if planner is not None else None, now=self._os.wall_time())
        nxt = next_command(self._command, Recovered(decision))
        if nxt.command is None:
            return self._give_up(nxt.reason)
        if nxt.source is Source.RESTART:
            self._budget.take_restart(now)
            record.restarts[kind] = record.restarts.get(kind, 0) + 1
            applied = self._autopilot.at_restart(record, self._command, planner)
            if applied is not None:
                self._switch_to(applied)
        else:
            assert decision.correction is not None and decision.constraint is not None
            self._budget.take_correction()
            record.correction_counts[kind] = record.correction_counts.get(kind, 0) + 1
            record.corrections.append(decision.correction)
            record.constraints.append(decision.constraint)
            _LOG.warning("corrected: %s: %s (%s)", kind, decision.change.describe(), decision.remedy_reason)
            if planner is not None:
                planner.rules = learned_rules(planner.rules, record.constraints)
            self._switch_to(nxt, save=False)
        delay = self._budget.backoff()
        self._transition(EngineState.BACKOFF, f"{nxt.reason}; relaunch in {delay:.1f}s")
        return delay

    def _give_up(self, reason: str) -> float | None:
        _LOG.error("gave up: %s", reason)
        self._transition(EngineState.FATAL, f"gave up: {reason}")
        return None

    # -- state file and observers ----------------------------------------------------------

    def _save(self) -> None:
        try:
            self._store.save(self._record)
        except OSError as exc:  # a full disk must not take the engine down with it
            _LOG.warning("state: cannot write %s: %s", self._store.path, exc)

    def _make_status(self) -> EngineStatus:
        return status_view.engine_status(self.name, self._state, self._reason, self._plan, self._command,
                                         self._record, self._running, self._memory, self._pressure, self._ending,
                                         self._procs, self._evidence, self._autopilot)

    def _save_and_publish(self) -> None:
        self._save()
        self._publish()

    def _publish(self) -> None:
        self._status = status = self._make_status()
        for observer in list(self._observers):
            try:
                observer(status)
            except Exception:  # an observer's bug must not stop the watchdog
                _LOG.exception("observer %r failed", observer)
