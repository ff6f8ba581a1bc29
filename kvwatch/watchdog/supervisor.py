"""The watchdog: one engine as an explicit state machine (after supervisord's process.py).

    STOPPED -> STARTING -> READY           launched; READY once /health and /metrics answer
    STARTING | READY -> BACKOFF -> STARTING  a failure with a remedy left (same or corrected plan)
    STARTING | READY -> FATAL              no remedy, or the policy's budget is spent (exit 78)
    any running state -> STOPPING -> STOPPED, BACKOFF -> STOPPED   SIGTERM/SIGINT (exit 0)

Every transition goes through `_transition`, with its reason; it saves the state file,
tells systemd and swaps in a fresh immutable EngineStatus (`status`, which the exporter polls;
observers, if any, are handed each one). Every OS call (spawn, stop, the process tree, leftovers,
reaping, the wall clock) goes through the injected WatchdogOs (os_interface.py), so every transition
runs in tests without a child process (tests/test_supervisor_transitions.py); each tick's decisions
are the pure step of launch_watch.py, a failure's are recovery.py's. Time is the injected Clock
(monotonic), and every wait is on the stop Event, so a stop request is never stuck behind a backoff
or a health probe interval.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import BinaryIO, Protocol

from kvwatch.boundary import engine_http
from kvwatch.boundary.device_probe import installed_vllm, installed_vllm_text
from kvwatch.boundary.engine_http import EngineMetrics, EnginePage
from kvwatch.boundary.plan_loader import flags_release
from kvwatch.boundary.proc_inspect import ProcRef
from kvwatch.boundary.startup_plan_file import read_persisted_plan
from kvwatch.diagnosis.start_phase import phase_of
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.errors import KvwatchError
from kvwatch.exitcodes import EXIT_GAVE_UP, EXIT_OK
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.plan import Plan
from kvwatch.planner.pressure import Recommendation, Window
from kvwatch.planner.rules import RuleSet, ruleset_for, with_learned_block_sizes
from kvwatch.planner.units import format_bytes
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.release_defaults import defaults_for
from kvwatch.vllm_releases.startup_plan import ENABLE_ENV as STARTUP_PLAN_ENV
from kvwatch.vllm_releases.startup_plan import pin_decision, plan_enabled
from kvwatch.vllm_releases.upgrade import ReleaseChange, planned_as, release_change
from kvwatch.watchdog import autopilot, disk_writer, learned_store, leftovers
from kvwatch.watchdog.autopilot import Apply, Trial, Verdict
from kvwatch.watchdog.budget import Budget
from kvwatch.watchdog.config import Config
from kvwatch.watchdog.engine_ranks import lines_of_rank
from kvwatch.watchdog.engine_tree import EngineTree
from kvwatch.watchdog.gpu_view import GpuView
from kvwatch.watchdog.host_memory_watch import HostMemoryLevel, describe_stop, stop_record
from kvwatch.watchdog.host_registry import HostRegistry
from kvwatch.watchdog.launch_evidence import LaunchEvidence
from kvwatch.watchdog.launch_watch import (
    Event,
    LaunchEnd,
    LaunchState,
    Timing,
    after_probe,
    before_probe,
    probe_due,
)
from kvwatch.watchdog.memory_learning import MAX_LEARNED_PROFILES, pin_for, remember_non_kv
from kvwatch.watchdog.os_interface import EngineHandle, RealOs, WatchdogOs
from kvwatch.watchdog.outcomes import NO_KERNEL_RECORD, LaunchOutcome
from kvwatch.watchdog.output_pump import OutputPump
from kvwatch.watchdog.ownership import EngineProof
from kvwatch.watchdog.persisted_command import judge_persisted
from kvwatch.watchdog.plan_in_force import PlanInForce
from kvwatch.watchdog.preflight import device_for_spec, learned_key, preflight
from kvwatch.watchdog.pressure_watch import PressureWatch
from kvwatch.watchdog.pressure_window import LoadSample
from kvwatch.watchdog.probe_pool import Probe, ProbePool
from kvwatch.watchdog.progress import Reading
from kvwatch.watchdog.records import PREFLIGHT, Constraint, FailureRecord
from kvwatch.watchdog.sd_notify import SdNotifier, scrub_env
from kvwatch.watchdog.state_store import EngineLock, EngineRecord, StateStore

_LOG = logging.getLogger(__name__)
__all__ = ["EXIT_FLUSH_SECONDS", "MAX_LEARNED_PROFILES", "Clock", "MonotonicClock", "Observer", "Supervisor"]

MAX_ROLLED_BACK = 32       # rolled-back changes remembered per profile (the decision table has five kinds)
EXIT_FLUSH_SECONDS = 2.0   # at exit, how long the last state file may take to reach the disk (then lost)

Observer = Callable[[EngineStatus], None]

_ALLOWED = {
    (EngineState.STOPPED, EngineState.STARTING),
    (EngineState.STARTING, EngineState.READY),
    (EngineState.STARTING, EngineState.BACKOFF),
    (EngineState.STARTING, EngineState.FATAL),
    (EngineState.STARTING, EngineState.STOPPING),
    (EngineState.READY, EngineState.BACKOFF),
    (EngineState.READY, EngineState.FATAL),
    (EngineState.READY, EngineState.STOPPING),
    (EngineState.BACKOFF, EngineState.STARTING),
    (EngineState.BACKOFF, EngineState.STOPPED),
    (EngineState.STOPPING, EngineState.STOPPED),
}


class Clock(Protocol):
    def now(self) -> float: ...
    def wait(self, event: threading.Event, seconds: float) -> bool: ...
    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds))

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass
class _Running:
    proc: EngineHandle
    pump: OutputPump
    started: float
    tree: EngineTree = field(default_factory=EngineTree)
    ended: bool = False


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
        self._probes = ProbePool(probe or _probe)
        self._ending: str | None = None   # why a served launch ended while its engine is being stopped
        self._pressure = PressureWatch(config.engine.pressure_window_seconds)   # KV pressure while serving
        self._budget = budget or Budget(config.policy)
        self._gpu_pids = gpu_pids
        self._store = StateStore(config.state_dir, config.name, writer=disk_writer.shared())  # never waits on disk
        self._lock = EngineLock(config.state_dir, config.name)
        self._stop = threading.Event()
        self._wake = threading.Event()   # the watch loop's alarm: a stop request or the engine's exit
        self._stop_reason = ""
        self._state = EngineState.STOPPED
        self._reason = "not started"
        self._record = EngineRecord(name=config.name)
        self._command = EngineCommand.parse(config.engine.command, flags_release(installed_vllm()))
        self._planner: PlanInForce | None = None   # from the start on: the plan in force
        self._running: _Running | None = None
        self._ready_sent = False
        self._spawn_error: str | None = None
        self._gpus: GpuView | None = None
        self._evidence = LaunchEvidence(self._os, lambda: self._gpu_view().snapshot())
        self._last_pids: frozenset[int] = frozenset()   # the last engine's processes, for the GPU-release wait
        self._pinned: int | None = None   # the KV bytes the running engine was launched pinned to
        self._requested: int | None = None   # the running engine's GPU budget (CUDA total x utilization)
        self._release_changes = 0   # the engine's vLLM release differed from the state file's
        self._upgrade: ReleaseChange | None = None   # that change, until the new release measured its cache
        self._proof: EngineProof | None = None   # what proves a process the running engine's (recorded at spawn)
        self._escaped = 0   # processes that looked like the engine's at the last stop or clean-up, not provably
        self._registry: HostRegistry | None = None   # the other instances' claims, read at a stop or clean-up
        self._trial: Trial | None = None   # [autopilot] the change being measured
        self._relaunch: tuple[EngineCommand, str] | None = None   # [autopilot] the command to relaunch with, and why
        self._page: EnginePage | None = None   # the last look at the running engine (the exporter's too)
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
            self._clean_leftovers()
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
            if end.served and end.outcome in (LaunchOutcome.HANG, LaunchOutcome.STALLED):
                # the engine still runs but serves nothing: readiness says so now, not after its stop
                _LOG.warning("launch ended: %s: %s", end.outcome.value, end.detail)
                self._ending = f"{end.outcome.value}: {end.detail}"
                self._publish()
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
        configured = list(self._command.argv)
        record = self._store.load()
        if record is not None and record.original_argv == configured and record.argv \
                and not self._refuse_persisted(record.argv, configured):
            self._record = record
            self._command = EngineCommand(tuple(record.argv), self._command.release)
            if record.argv != configured:
                _LOG.info("state: reusing the corrected command from %s: %s", self._store.path,
                          " ".join(record.argv))
        else:
            if record is not None:
                _LOG.info("state: the engine command changed; earlier corrections do not apply, "
                          "what this host's engine taught (constraints) does")
                self._record = EngineRecord(name=self.name, pids=record.pids, pgid=record.pgid,
                                            engine_proof=record.engine_proof, constraints=record.constraints,
                                            autopilot_changes=record.autopilot_changes,
                                            autopilot_rolled_back=record.autopilot_rolled_back)
            self._record.original_argv = configured
            self._record.argv = configured
        self._note_release(record)
        self._after_host_memory_stop()
        self._record.restarts, self._record.failure_counts, self._record.correction_counts = {}, {}, {}
        self._record.autopilot_counts = {}
        self._resume_trial()
        # What an earlier kvwatch left in the file is history now: this one has launched nothing yet.
        self._record.state, self._record.reason = EngineState.STOPPED.value, "kvwatch started"
        own = self._os.own_ref()
        self._record.kvwatch_pid, self._record.kvwatch_create_time = own.pid, own.create_time
        if self._device is None:
            self._device = device_for_spec(self.config.device)
        rules = self._rules if self._rules is not None else ruleset_for(installed_vllm_text())
        planner = self._planner = PlanInForce(self._device, self._learned_rules(rules), self._engine_env)
        if self.config.learned_dir:   # what another host measured for this profile, unless this host knows
            learned_store.adopt_into(self._record.learned_non_kv, self.config.learned_dir, self._command,
                                     planner.device, self._gpu_view().context())
        if self.config.policy.preflight:
            command, fixes, _ = preflight(self._command, planner.device, planner.rules, self._engine_env(),
                                          self.config.policy, self._record.learned_non_kv, planner.model)
            if fixes:
                self._record.preflight = list(fixes)
                self._record.constraints += [Constraint(f.kind, f.message, f.change, PREFLIGHT) for f in fixes]
                self._command = command
                self._record.argv = list(command.argv)
        planner.compute(self._command, self._record.learned_non_kv)
        self._save()
        self._publish()

    def _after_host_memory_stop(self) -> None:
        """A stop for host memory that no failure followed (the host wedged or rebooted first): said, counted
        as the host OOM it was, and this start re-plans with less host memory rather than repeat it."""
        from kvwatch.diagnosis import Diagnosis
        from kvwatch.watchdog import recovery

        record = self._record
        stop = record.host_memory_stops[-1] if record.host_memory_stops else None
        if stop is None or any(f.time >= stop.time for f in record.failures):
            return
        said = describe_stop(stop, self._os.boot_id())
        _LOG.warning("state: %s", said)
        record.failures.append(FailureRecord(FailureKind.HOST_OOM, said, stop.time, list(stop.argv),
                                             "stopped for host memory", stop.phase))
        if list(stop.argv) != list(self._command.argv):
            return
        diagnosis = Diagnosis(FailureKind.HOST_OOM, said, {"phase": stop.phase, "repeats": 1}, fatal=False)
        decision = recovery.decide(diagnosis, self._command, tried=recovery.tried_plans(record.failures),
                                   policy=self.config.policy, now=self._os.wall_time())
        if decision.action is recovery.Action.CORRECT and decision.command is not None \
                and decision.correction is not None:
            _LOG.warning("corrected: host_oom: %s (%s)", decision.change.describe(), decision.remedy_reason)
            record.corrections.append(decision.correction)
            self._command = decision.command
            record.argv = list(decision.command.argv)

    def _refuse_persisted(self, persisted: list[str], configured: list[str]) -> bool:
        """Whether the state file's command is not the configured one with kvwatch's own changes."""
        verdict = judge_persisted(persisted, configured, self._command.release, self.config.policy.fixed_flags)
        if not verdict.accepted:
            _LOG.warning("state: %s holds a command kvwatch did not write (%s): not launched; launching the "
                         "configured command", self._store.path, verdict.reason)
        return not verdict.accepted

    @property
    def _plan(self) -> Plan | None:
        return self._planner.plan if self._planner is not None else None

    def _note_release(self, last: EngineRecord | None) -> None:
        """An image upgrade: the release recorded at the last launch is not the one installed now."""
        current = installed_vllm_text()
        change = release_change(last.vllm_release if last else None, current,
                                last.log_kv_tokens if last else None, last.log_available_kv_bytes if last else None)
        if change is not None:
            _LOG.warning("release: %s", change.message)
            self._release_changes += 1
            self._upgrade = change
        self._record.vllm_release = current or self._record.vllm_release

    def _learned_rules(self, rules: RuleSet) -> RuleSet:
        """The rule table, with the block sizes earlier failures on this host reported."""
        learned: dict[str, list[object]] = {}
        for constraint in self._record.constraints:
            learned.update(constraint.backend_block_sizes)
        return with_learned_block_sizes(rules, learned) if learned else rules

    def _engine_env(self) -> dict[str, str]:
        env = scrub_env(self._environ)
        env.update(self.config.engine.environment)
        env.setdefault("PYTHONUNBUFFERED", "1")  # vLLM logs to stdout: unbuffered, so a crash loses nothing
        env[leftovers.MARKER_ENV] = self._marker()
        return env

    def _marker(self) -> str:
        return leftovers.marker(self.config.state_dir, self.name)

    def _pinned_argv(self, planner: PlanInForce) -> list[str]:
        """The command, with --kv-cache-memory-bytes pinned to what the learned plan (the plan in force
        before the pin) gives the KV cache less the memory other processes hold on the GPU now
        (engine.pin_kv_cache_memory)."""
        argv = list(self._command.argv)
        if not self.config.engine.pin_kv_cache_memory or self._command.has("--kv-cache-memory-bytes"):
            return argv
        learned = planner.plan
        if learned is None or learned.source != "learned":
            _LOG.info("pin: nothing learned yet for this profile: vLLM profiles the memory itself")
            return argv
        decision = pin_decision(plan_enabled(defaults_for(installed_vllm() or DEFAULT_RELEASE),
                                             self._engine_env().get(STARTUP_PLAN_ENV)),
                                learned.kv_memory_bytes, read_persisted_plan(self._record.vllm_startup_plan))
        if not decision.pin:
            _LOG.info("pin: %s", decision.reason)
            return argv
        foreign = self._gpu_view().foreign_bytes() or 0
        pin = pin_for(learned, foreign)
        if pin.kv_bytes is None:
            _LOG.warning("pin: not pinned: other processes hold %s of the GPU, more than the learned KV cache "
                         "(%s); vLLM profiles the memory itself", format_bytes(foreign),
                         format_bytes(learned.kv_memory_bytes))
            return argv
        _LOG.info("pin: --kv-cache-memory-bytes %d (learned %s%s)", pin.kv_bytes, format_bytes(learned.kv_memory_bytes),
                  f", less {format_bytes(foreign)} other processes hold" if foreign else "")
        self._pinned = pin.kv_bytes
        return [*argv, "--kv-cache-memory-bytes", str(pin.kv_bytes)]

    def _launch(self) -> None:
        planner = self._planner
        assert planner is not None
        planner.begin_launch()   # config.json read once for this launch
        self._pinned = None
        self._ending = None
        self._pressure.reset()
        planner.compute(self._command, self._record.learned_non_kv)
        argv = self._pinned_argv(planner)
        self._requested = planner.requested_bytes(self._command)
        if self._pinned is not None:
            planner.compute(EngineCommand(tuple(argv), self._command.release))   # the plan in force is the pinned launch's: exact
        if argv not in self._record.plans_tried:
            self._record.plans_tried.append(argv)
        self._transition(EngineState.STARTING, f"launching: {' '.join(argv)}")
        self._evidence.before_launch()
        try:
            proc = self._os.spawn(argv, self._engine_env(),
                                  reaper_grace=min(10.0, self.config.engine.stop_timeout_seconds))
        except OSError as exc:
            self._running = None
            self._spawn_error = f"cannot start {argv[0]}: {exc.strerror or exc}"
            return
        self._spawn_error = None
        proc.on_exit(self._wake.set)
        pump = OutputPump(self.name, proc.stdout, self._output).start()
        self._running = _Running(proc, pump, self._clock.now())
        _LOG.info("spawned: pid %d (group %d): %s", proc.pid, proc.pgid, " ".join(argv))
        self._record.pgid = proc.pgid
        # Recorded before anything else of the engine: the next kvwatch proves its processes from it.
        self._proof = self._os.proof(proc)
        self._record.engine_proof = self._proof.to_json() if self._proof is not None else {}
        self._refresh_tree(force=True)

    def _clean_leftovers(self) -> None:
        refs = []
        for item in self._record.pids:
            try:
                refs.append(ProcRef.from_json(item))
            except (KeyError, TypeError, ValueError):
                continue
        try:
            port: int | None = self._command.settings().port
        except KvwatchError:
            port = None
        report = self._os.clean_leftovers(refs, self._recorded_proof(), port, self._gpu_holders,
                                          self.config.engine.stop_timeout_seconds, self._sleep, self._others)
        self._record.foreign = report.foreign
        self._record.pids = []
        self._record.engine_proof = {}
        self._note_escaped(report.escaped)

    def _others(self) -> frozenset[int]:
        """The pids other kvwatch instances on this host claim (never reported as escaped from ours)."""
        if self._registry is None:   # read only: this kvwatch's own claim is the exporter's to write
            self._registry = HostRegistry(self.config.state_dir, self.name)
        return self._registry.others()

    def _note_escaped(self, lines: list[str]) -> None:
        """Lookalikes not provably the engine's (ownership.py): logged by leftovers, kept, counted."""
        self._record.escaped = lines
        self._escaped = len(lines)

    def _recorded_proof(self) -> EngineProof | None:
        """The proof the state file kept of the last engine (an earlier kvwatch's, killed or not)."""
        if not self._record.engine_proof:
            return None
        try:
            return EngineProof.from_json(self._record.engine_proof)
        except ValueError as exc:
            _LOG.warning("state: %s; its processes cannot be proven the engine's", exc)
            return None

    def _owned_pids(self) -> frozenset[int]:
        """The running engine's processes, proven (ownership.py): for the GPU's holders."""
        run = self._running
        proof = self._proof if run is not None else self._recorded_proof()
        recorded = run.tree.refs if run is not None else []
        reaper = run.proc.own_pids - {run.proc.pid} if run is not None else frozenset()
        return frozenset(r.pid for r, _ in self._os.owned(proof, recorded, reaper))

    def _gpu_holders(self) -> list[tuple[str, int]]:
        if self._gpu_pids is not None:
            return self._gpu_pids()
        return self._gpu_view().holders()

    def _gpu_view(self) -> GpuView:
        if self._gpus is None:
            self._gpus = GpuView(self._device, self._owned_pids)
        return self._gpus

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

        def died_in_log(since_line: int) -> str | None:
            return self._died_in_log(run.pump.lines_since(since_line))

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
                self._refresh_tree()  # before a transition, so its status carries the current pids
                page = self._read_engine(url, timing.probe_timeout, run) if probed and state.ready else None
                self._page = EnginePage(probed, page)
                metrics = page if page is not None and page.ok else None
                reading = self._progress_reading(metrics, run) if metrics is not None else None
                now = self._clock.now()
                state, event, end = after_probe(state, probed, now, timing, run.pump.lines_seen, died_in_log,
                                                reading)
                if metrics is not None and end is None:
                    self._watch_pressure(metrics)
                    end = self._autopilot_step()
                if event is Event.READY:
                    self._transition(EngineState.READY, f"serving on {url} after {now - run.started:.0f}s")
                elif event is Event.STABLE:
                    self._budget.stable()
                    _LOG.info("stable: READY for %.0fs; backoff reset", now - (state.ready_since or now))
                if end is not None:
                    return end
            elif run.tree.ranks.cores:
                self._refresh_tree()  # DP engine cores: every tick, to see which one dies first
            self._refresh_facts()
            end = self._host_memory_step(run, state.ready)
            if end is not None:
                return end
            self._reap_orphans()
            if not run.proc.reaper_alive():
                _LOG.warning("reaper: gone; starting a new one")
                run.proc.start_reaper()
            self._notifier.watchdog(self._clock.now())
            self._clock.wait(self._wake, timing.tick)  # wakes at once on a stop request or the engine's exit
            self._wake.clear()

    def _read_engine(self, url: str, timeout: float, run: _Running) -> EngineMetrics | None:
        """The engine's /metrics, read on the probe pool with the probe's deadline (None: not read)."""
        return self._probes.read(lambda: engine_http.scrape(url, timeout),
                                 interrupted=lambda: self._stop.is_set() or run.proc.poll() is not None,
                                 waiting=lambda: self._notifier.watchdog(self._clock.now()))

    def _progress_reading(self, metrics: EngineMetrics, run: _Running) -> Reading:
        """The engine's counters for the stall detector. On a CPU backend the CPU time of its engine
        cores and workers (not the API server, nor helpers such as multiprocessing's resource
        tracker or adopted orphans) is progress too; an engine whose processes carry no vLLM title,
        all of its tree but the process spawned."""
        cpu = None
        if self._device is not None and self._device.platform == "cpu":
            cpu = self._os.cpu_seconds(run.tree.compute or (run.tree.live - {run.proc.pid}))
        load = metrics.load
        return Reading(self._clock.now(), load.running, load.prompt_tokens, load.generation_tokens, cpu)

    def _watch_pressure(self, metrics: EngineMetrics) -> None:
        """The engine's load into the pressure window; when the recommendation changes, say so (log,
        status, state file). Re-plans happen only under pressure, at most every EVERY_SECONDS."""
        load, now, planner = metrics.load, self._clock.now(), self._planner
        self._pressure.observe(LoadSample(now, load.preemptions, metrics.kv_cache_usage_ratio, load.waiting,
                                          load.request_tokens, load.requests, load.prompt_buckets,
                                          load.generation_buckets, load.generation_tokens))
        if planner is None:
            return
        try:
            settings = self._command.settings()
        except KvwatchError:
            return
        gpu = self._gpu_view().context() if planner.device.platform == "cuda" else None
        command = self._command

        def replan(change: FlagChange) -> Plan | None:
            return planner.what_if(change.apply(command), self._record.learned_non_kv)

        # A change to a fixed flag is recommended like any other; the autopilot never applies it.
        if not self._pressure.judge(now, planner.plan, settings, gpu.free_bytes if gpu else None, replan,
                                    (), self._rolled_back(self._profile())):
            return
        found = self._pressure.recommendation
        if found is not None:
            _LOG.warning("pressure: %s: recommend %s (KV tokens %s -> %s)", found.reason, found.change.describe(),
                         f"{found.tokens_before:,}", f"{found.tokens_after:,}")
        else:
            _LOG.info("pressure: no KV pressure now; no recommendation")
        self._record.recommendation = found.to_json() if found is not None else {}
        self._save()
        self._publish()

    # -- autopilot ([autopilot]: applying a KV-pressure change, measuring it, keeping or rolling it back)

    def _profile(self) -> str:
        planner = self._planner
        return (learned_key(self._command, planner.device) if planner is not None else None) or ""

    def _rolled_back(self, profile: str) -> list[FlagChange]:
        out = []
        for item in self._record.autopilot_rolled_back.get(profile, []):
            try:
                out.append(FlagChange.from_json(item))
            except (ValueError, TypeError, AttributeError):
                continue
        return out

    def _applied_times(self) -> list[float]:
        return [float(c["at"]) for c in self._record.autopilot_changes
                if isinstance(c, dict) and isinstance(c.get("at"), (int, float))]

    def _resume_trial(self) -> None:
        """A trial the last kvwatch left open goes on: measured again from this launch's READY."""
        data = self._record.autopilot_trial
        if not data:
            return
        try:
            self._trial = Trial.from_json(data)
        except (KeyError, ValueError, TypeError, AttributeError):
            _LOG.warning("autopilot: the trial in %s is unreadable; forgotten", self._store.path)
            self._record.autopilot_trial = {}
            return
        _LOG.info("autopilot: %s is still on trial; measured again once serving", self._trial.change.describe())

    def _autopilot_step(self) -> LaunchEnd | None:
        """At each read of a READY engine's series: conclude the trial once measured, or, in the window,
        begin one with the standing recommendation. A LaunchEnd when the engine is to be relaunched."""
        cfg = self.config.autopilot
        trial = self._trial
        if trial is not None:
            now = self._clock.now()
            if trial.serving_since is None:
                self._trial = trial = replace(trial, serving_since=now)
            after = self._pressure.window(cfg.measure_seconds)
            result = autopilot.measured(trial, now, cfg.measure_seconds, after)
            if result is None:
                return None
            self._conclude(trial, result, after)
            return LaunchEnd(LaunchOutcome.AUTOPILOT, self._relaunch[1], served=True) if self._relaunch else None
        found = self._pressure.recommendation
        if cfg.apply is Apply.NEVER or found is None:
            return None
        if not autopilot.may_apply(cfg, self._os.wall_time(), self._applied_times(), False, restarting=False):
            return None
        if not self._begin_trial(found, "window"):
            return None
        assert self._relaunch is not None
        return LaunchEnd(LaunchOutcome.AUTOPILOT, self._relaunch[1], served=True)

    def _autopilot_at_restart(self) -> None:
        """A restart kvwatch makes anyway (the same plan): the standing recommendation goes with it."""
        found = self._pressure.recommendation
        if found is None or self._trial is not None:
            return
        if autopilot.may_apply(self.config.autopilot, self._os.wall_time(), self._applied_times(), False,
                               restarting=True) and self._begin_trial(found, "at_restart"):
            self._switch_to(*self._take_relaunch())

    def _begin_trial(self, found: Recommendation, when: str) -> bool:
        """Put the recommendation on trial: measured against the window before it. False when it may not
        be (a fixed flag, rolled back before for this profile, no window to compare with)."""
        profile = self._profile()
        before = self._pressure.window(self.config.engine.pressure_window_seconds)
        if not autopilot.comparable(before, self.config.engine.pressure_window_seconds) or \
                not autopilot.applicable(found.change, self.config.policy.fixed_flags, self._rolled_back(profile)):
            return False
        assert before is not None
        wall, record = self._os.wall_time(), self._record
        trial = Trial(found.change, wall, None, before, self._command.argv, profile, found.reason)
        self._trial = trial
        record.autopilot_trial = trial.to_json()
        record.autopilot_changes.append({
            "at": wall, "change": found.change.to_json(), "describe": found.change.describe(),
            "reason": found.reason, "profile": profile, "when": when, "before": autopilot.figures(before),
            "after": None, "result": "on_trial", "detail": ""})
        record.autopilot_counts["applied"] = record.autopilot_counts.get("applied", 0) + 1
        _LOG.warning("autopilot: applying %s (%s; %s); measured over %.0fs of serving", found.change.describe(),
                     found.reason, when.replace("_", " "), self.config.autopilot.measure_seconds)
        self._pressure.recommendation = None   # in force now, not a recommendation
        record.recommendation = {}
        self._relaunch = (found.change.apply(self._command), f"apply {found.change.describe()}")
        self._save()
        self._publish()
        return True

    def _conclude(self, trial: Trial, result: Verdict, after: Window | None, detail: str = "") -> None:
        """The trial's end: kept, or rolled back (the plan before is relaunched; never tried again here)."""
        record = self._record
        kept = result is Verdict.KEEP
        outcome = "kept" if kept else "rolled_back"
        measured = autopilot.compared(trial.before, after) if after is not None else ""
        detail = detail or measured
        entry = record.autopilot_changes[-1] if record.autopilot_changes else None
        if entry is None or entry.get("result") != "on_trial" or entry.get("change") != trial.change.to_json():
            entry = {"at": trial.applied_at, "change": trial.change.to_json(), "describe": trial.change.describe(),
                     "reason": trial.reason, "profile": trial.profile, "before": autopilot.figures(trial.before)}
            record.autopilot_changes.append(entry)
        entry.update(after=autopilot.figures(after) if after is not None else None, result=outcome, detail=detail)
        record.autopilot_counts[outcome] = record.autopilot_counts.get(outcome, 0) + 1
        record.autopilot_trial = {}
        self._trial = None
        if kept:
            _LOG.warning("autopilot: kept %s: %s", trial.change.describe(), detail)
        else:
            _LOG.warning("autopilot: rolling back %s: %s", trial.change.describe(), detail)
            rolled = record.autopilot_rolled_back
            rolled.setdefault(trial.profile, []).append(trial.change.to_json())
            del rolled[trial.profile][:-MAX_ROLLED_BACK]
            for profile in list(rolled)[:-MAX_LEARNED_PROFILES]:   # bounded as the learned profiles are
                del rolled[profile]
            self._relaunch = (EngineCommand(trial.before_argv, self._command.release),
                              f"roll back {trial.change.describe()}")
        self._save()
        self._publish()

    def _take_relaunch(self) -> tuple[EngineCommand, str]:
        relaunch, self._relaunch = self._relaunch, None
        assert relaunch is not None
        return relaunch

    def _switch_to(self, command: EngineCommand, why: str) -> None:
        """The command in force is now `command` (the autopilot's change, or the plan before it)."""
        self._command = command
        self._record.argv = list(command.argv)
        if self._planner is not None:
            self._planner.compute(command, self._record.learned_non_kv)
        self._save()

    def _autopilot_relaunch(self) -> bool:
        """Drain the serving engine (readiness 503, running requests finish), stop it and relaunch it
        with the autopilot's command. True when a stop was requested while draining."""
        command, why = self._take_relaunch()
        self._ending = f"autopilot: draining to {why}"
        self._publish()   # readiness 503 from now on
        if self._drain():   # asked to stop: the next kvwatch launches the new command (and resumes its trial)
            self._switch_to(command, why)
            return True
        self._end_engine()
        self._running = None
        self._switch_to(command, why)
        self._transition(EngineState.BACKOFF, f"autopilot: {why}; relaunch now")
        return False

    def _drain(self) -> bool:
        """Wait for the engine's running and waiting requests to finish, up to drain_timeout_seconds
        (its own series); True when a stop was requested meanwhile."""
        run = self._running
        if run is None:
            return False
        cfg = self.config.engine
        timeout, url = self.config.autopilot.drain_timeout_seconds, self._command.health_url()
        start = self._clock.now()
        while True:
            if self._stop.is_set():
                return True
            if run.proc.poll() is not None:
                return False
            metrics = self._read_engine(url, max(1.0, min(5.0, cfg.health_interval_seconds)), run)
            load = metrics.load if metrics is not None else None
            waited = self._clock.now() - start
            if autopilot.drained(load.running if load else None, load.waiting if load else None, waited, timeout):
                if load is not None and (load.running or 0) + (load.waiting or 0) > 0:
                    _LOG.warning("autopilot: drain: %s requests still running, %s waiting after %.0fs",
                                 f"{load.running:.0f}", f"{load.waiting or 0:.0f}", waited)
                else:
                    _LOG.info("autopilot: drained in %.1fs", waited)
                return False
            if self._wait(min(1.0, cfg.health_interval_seconds)):
                return True

    @staticmethod
    def _died_in_log(lines: list[str]) -> str | None:
        """/health failed: did the engine say, since READY, that it died (EngineCore gone, ...)?"""
        if not lines:
            return None
        from kvwatch.diagnosis import FailureKind, diagnose

        diagnosis = diagnose(lines)
        if diagnosis.kind == FailureKind.UNKNOWN:
            return None
        return f"/health failed after the engine logged: {diagnosis.evidence or diagnosis.kind}"

    def _reap_orphans(self) -> None:
        """As PID 1 (a container's entrypoint), reap the orphans re-parented to us."""
        keep = self._running.proc.own_pids if self._running is not None else frozenset()
        for pid in self._os.reap_orphans(keep):
            _LOG.info("reaped: orphan pid %d", pid)

    def _refresh_tree(self, force: bool = False) -> None:
        run = self._running
        if run is None:
            return
        infos = self._os.tree(run.proc)
        lost, changed = run.tree.update(infos, force)
        for rank in lost:
            _LOG.warning("engine core of data-parallel rank %d (pid %d) is gone while the others run",
                         rank, run.tree.ranks.lost[rank])
        if not changed:
            return
        self._record.pids = [p.to_json() for p in infos]
        self._save()
        self._publish()

    def _refresh_facts(self) -> None:
        run = self._running
        if run is None:
            return
        facts = run.pump.facts
        parts = facts.memory_parts()
        record = self._record
        if (facts.kv_tokens, facts.available_kv_bytes, parts) == (record.log_kv_tokens, record.log_available_kv_bytes,
                                                                  record.log_memory_parts):
            return
        record.log_kv_tokens = facts.kv_tokens
        record.log_available_kv_bytes = facts.available_kv_bytes
        record.log_memory_parts = parts
        record.vllm_startup_plan = facts.startup_plan_path or record.vllm_startup_plan
        if self._upgrade is not None and facts.kv_tokens is not None:   # capacity against the last release's
            _LOG.warning("release: %s", self._upgrade.capacity_message(facts.kv_tokens, facts.kv_cache_bytes)
                         or f"vLLM {self._upgrade.after}: {facts.kv_tokens:,} KV tokens")
            self._upgrade = None
        self._learn_non_kv(facts.kv_cache_bytes)   # a boot on vLLM's own plan logs no profile: its plan is the figure
        self._save()
        self._publish()

    def _learn_non_kv(self, available_kv_bytes: int | None) -> None:
        """The engine said what its profile left the KV cache: keep the non-KV memory that implies
        for this profile (model, batch flags, card, vLLM), and refine the plan in force at once.
        A pinned launch profiled nothing: its figure is the pin."""
        requested, planner = self._requested, self._planner
        if self._pinned is not None:
            return
        if available_kv_bytes is None or requested is None or planner is None:
            return
        key = learned_key(self._command, planner.device)
        if key is None:
            return
        remember_non_kv(self._record.learned_non_kv, key, requested, available_kv_bytes)
        learned_store.publish(self.config.learned_dir, self._command, planner.device, requested, available_kv_bytes)
        planner.compute(self._command, self._record.learned_non_kv)

    def _host_memory_step(self, run: _Running, served: bool) -> LaunchEnd | None:
        """Stop the engine before host memory wedges the host; the record of it is written first, so the
        next start re-plans even after a reboot."""
        verdict = self._evidence.host_memory()
        if verdict is None or verdict.level is not HostMemoryLevel.STOP:
            return None

        stop = stop_record(verdict, phase_of(run.pump.lines()), list(self._command.argv), self._os.wall_time(),
                           self._os.boot_id())
        self._record.host_memory_stops.append(stop)
        self._save()
        disk_writer.shared().flush(2.0)   # on disk before the stop, but never waiting long on a frozen one
        _LOG.error("host memory: %s: stopping the engine group before the host wedges", verdict.reason)
        return LaunchEnd(LaunchOutcome.HOST_MEMORY, f"stopped by kvwatch before host memory ran out: "
                         f"{verdict.reason}", served=served)

    def _wait_gpu_release(self) -> None:
        """Before a relaunch: until the dead engine's GPU memory is released (bounded), said and exported."""
        verdict = self._evidence.wait_gpu_release(self._last_pids, self._clock.now, self._sleep, self._stop.is_set)
        if verdict is not None:
            _LOG.info("gpu release: %s", verdict.text)
            self._publish()

    def _end_engine(self) -> None:
        """Stop the whole group (whatever is left of it), drain the output, forget the pids."""
        run = self._running
        if run is None or run.ended:
            return
        run.ended = True
        self._page = None
        timeout = self.config.engine.stop_timeout_seconds
        # Proven before the group is signalled, while the engine's session still has its leader: a
        # descendant that left the group (a double-forked daemon) goes with it.
        reaper = run.proc.own_pids - {run.proc.pid}   # kvwatch's child too, never the engine's
        seen = {r.pid for r in run.tree.refs}
        self._last_pids = frozenset(seen | {run.proc.pid})
        owned = list(run.tree.refs)
        for ref, why in self._os.owned(self._proof, run.tree.refs, reaper):
            if ref.pid not in seen:   # out of the tree kvwatch watches: say why it is ended
                _LOG.warning("stop: pid %d is the engine's: %s; ending it with the group", ref.pid, why)
                owned.append(ref)
        self._os.stop_group(run.proc, timeout, owned, self._clock.now, self._sleep)
        # What forked meanwhile, or left the session: a second look, then the lookalikes reported.
        stopped, escaped = self._os.end_owned(self._proof, owned, timeout, self._sleep, reaper, self._others)
        if stopped:
            _LOG.warning("stop: ended %d engine process(es) outside its group: %s", len(stopped), stopped)
        self._note_escaped(escaped)
        run.proc.release_reaper()
        if run.pump.join(timeout=10):
            run.proc.close()
        else:
            _LOG.warning("pump %s: output still open after the group ended", self.name)
        _LOG.info("exited: pid %d, code %s", run.proc.pid, run.proc.returncode)
        self._reap_orphans()
        self._record.pids = []
        self._record.engine_proof = {}
        self._save()
        self._publish()

    # -- failure -------------------------------------------------------------------------

    def _after_failure(self, end: LaunchEnd) -> float | None:
        """Diagnose, pick the remedy, count it: the backoff delay, or None after going FATAL."""
        from kvwatch.watchdog import recovery  # here: the diagnosis is loaded only when an engine fails

        run, self._running = self._running, None
        lines = run.pump.lines() if run is not None else []
        lost_rank = next(iter(run.tree.ranks.lost), None) if run is not None else None
        if lost_rank is not None:   # one DP rank's core died first: diagnose by its lines
            lines = lines_of_rank(lines, lost_rank)
        record = self._record
        kernel = self._evidence.kernel_record() if end.outcome in _KERNEL_RECORDED else NO_KERNEL_RECORD
        diagnosis = recovery.diagnosis_of(
            end.outcome, end.detail, lines, end.served, returncode=end.returncode, signal_name=_signal_name(end),
            kernel=kernel, earlier=record.failures, argv=self._command.argv, now=self._os.wall_time())
        if lost_rank is not None and run is not None:
            diagnosis = recovery.with_rank(diagnosis, lost_rank, run.tree.ranks.lost[lost_rank])
        failure = recovery.failure_record(diagnosis, end.detail, self._command, self._os.wall_time())
        kind = failure.kind.value   # the counters' keys: the metrics' label values
        _LOG.warning("failed: %s (%s): %s", kind, end.detail, failure.evidence)
        record.failure_counts[kind] = record.failure_counts.get(kind, 0) + 1
        record.failures.append(failure)

        if self._trial is not None:   # the change on trial did not survive its trial: the plan before again
            self._conclude(self._trial, Verdict.ROLL_BACK, None, f"the engine failed ({kind}) during the trial")
            self._switch_to(*self._take_relaunch())
        planner = self._planner
        now = self._clock.now()
        budget = recovery.BudgetState(self._budget.restart_refusal(now), self._budget.correction_refusal())
        decision = recovery.decide(
            diagnosis, self._command, detail=end.detail, tried=recovery.tried_plans(record.failures),
            budget=budget, policy=self.config.policy, plan=self._plan, gpu=self._gpu_view().context(),
            rules=planner.rules if planner is not None else None, now=self._os.wall_time())
        if decision.action is recovery.Action.GIVE_UP:
            return self._give_up(decision.reason)
        if decision.action is recovery.Action.RESTART:
            self._budget.take_restart(now)
            record.restarts[kind] = record.restarts.get(kind, 0) + 1
            self._autopilot_at_restart()
        else:
            assert decision.command is not None and decision.correction is not None
            assert decision.constraint is not None
            self._budget.take_correction()
            record.correction_counts[kind] = record.correction_counts.get(kind, 0) + 1
            record.corrections.append(decision.correction)
            record.constraints.append(decision.constraint)
            _LOG.warning("corrected: %s: %s (%s)", kind, decision.change.describe(), decision.remedy_reason)
            self._command = decision.command
            record.argv = list(decision.command.argv)
            if planner is not None:
                planner.rules = self._learned_rules(planner.rules)
                planner.compute(self._command, record.learned_non_kv)
        delay = self._budget.backoff()
        self._transition(EngineState.BACKOFF, f"{decision.reason}; relaunch in {delay:.1f}s")
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
        record = self._record
        last = record.last_failure()
        return EngineStatus(
            name=self.name, state=self._state, reason=self._reason, plan=self._plan, argv=self._command.argv,
            pids=tuple(int(p["pid"]) for p in record.pids),
            pid_ranks=dict(self._running.tree.pid_ranks) if self._running is not None else {},
            restarts=dict(record.restarts), failures=dict(record.failure_counts),
            corrections=dict(record.correction_counts), last_failure=last.kind.value if last else None,
            log_kv_tokens=record.log_kv_tokens, log_available_kv_bytes=record.log_available_kv_bytes,
            log_memory_parts=dict(record.log_memory_parts), memory_requested_bytes=self._requested,
            vllm_release=record.vllm_release, release_changes=self._release_changes,
            vllm_release_planned_as=planned_as(record.vllm_release),
            recommendation=self._pressure.recommendation, ending=self._ending,
            escaped_processes=self._escaped,
            autopilot=dict(record.autopilot_counts),
            gpu_release_waits=dict(self._evidence.release_waits),
            gpu_release_wait_seconds=self._evidence.last_release_wait,
            autopilot_trial=self._trial.change.describe() if self._trial is not None else None)

    def _publish(self) -> None:
        self._status = status = self._make_status()
        for observer in list(self._observers):
            try:
                observer(status)
            except Exception:  # an observer's bug must not stop the watchdog
                _LOG.exception("observer %r failed", observer)


# How a launch ended that the kernel may have recorded (an OOM kill): read its record then.
_KERNEL_RECORDED = frozenset({LaunchOutcome.EXIT, LaunchOutcome.START_TIMEOUT, LaunchOutcome.HOST_MEMORY})


def _signal_name(end: LaunchEnd) -> str:
    """The name of the signal that ended the engine (SIGKILL, ...), "" when it exited by itself."""
    code = end.returncode
    if end.outcome is not LaunchOutcome.EXIT or code is None or code >= 0:
        return ""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return ""


def _probe(url: str, timeout: float, starting: bool) -> bool:
    """READY needs /health and a readable /metrics; once READY, /health alone is watched."""
    if not engine_http.health(url, timeout):
        return False
    return engine_http.scrape(url, timeout).ok if starting else True
