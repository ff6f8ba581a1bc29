"""The watchdog: one engine as an explicit state machine (after supervisord's process.py).

    STOPPED -> STARTING -> READY           launched; READY once /health and /metrics answer
    STARTING | READY -> BACKOFF -> STARTING  a failure with a remedy left (same or corrected plan)
    STARTING | READY -> FATAL              no remedy, or the policy's budget is spent (exit 78)
    any running state -> STOPPING -> STOPPED, BACKOFF -> STOPPED   SIGTERM/SIGINT (exit 0)

Every transition goes through `_transition`, with its reason; it saves the state file,
tells systemd and hands a fresh EngineStatus to the observers (the exporter). Time is
the injected Clock (monotonic), and every wait is on the stop Event, so a stop request
is never stuck behind a backoff or a health probe interval.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from kvwatch.boundary import engine_http, proc_inspect, spawn
from kvwatch.boundary.device_probe import installed_version, installed_vllm_version
from kvwatch.boundary.proc_inspect import ProcRef
from kvwatch.boundary.spawn import EngineProcess
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.errors import KvwatchError
from kvwatch.exitcodes import EXIT_GAVE_UP, EXIT_OK
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.gpu_budget import requested_bytes
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import RuleSet, ruleset_for, with_learned_block_sizes
from kvwatch.planner.units import format_bytes
from kvwatch.watchdog import learned_store, leftovers
from kvwatch.watchdog.budget import Budget
from kvwatch.watchdog.config import Config
from kvwatch.watchdog.engine_ranks import RankWatch, lines_of_rank, ranks_of_tree
from kvwatch.watchdog.gpu_view import GpuView
from kvwatch.watchdog.outcomes import EXIT, HANG, SPAWN_FAILED, START_TIMEOUT, STOP
from kvwatch.watchdog.output_pump import OutputPump
from kvwatch.watchdog.preflight import choose_device, learned_key, plan_for, preflight
from kvwatch.watchdog.records import PREFLIGHT, Constraint
from kvwatch.watchdog.sd_notify import SdNotifier, scrub_env
from kvwatch.watchdog.state_store import EngineLock, EngineRecord, StateStore

_LOG = logging.getLogger(__name__)
MAX_LEARNED_PROFILES = 32   # learned non-KV figures kept per engine (one per profile: flags, card, vLLM)

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
class _Outcome:
    """How one launch ended."""

    kind: str                 # one of kvwatch.watchdog.outcomes
    detail: str = ""
    returncode: int | None = None
    served: bool = False


@dataclass
class _Running:
    proc: EngineProcess
    pump: OutputPump
    started: float
    refs: list[ProcRef] = field(default_factory=list)   # every process seen in the tree, dead ones too
    live: frozenset[int] = frozenset()                     # the pids of the last look
    ended: bool = False
    ranks: RankWatch = field(default_factory=RankWatch)    # data-parallel engine cores, and which died
    pid_ranks: dict[int, int] = field(default_factory=dict)  # pid -> DP rank of the core it belongs to


class Supervisor:
    def __init__(self, config: Config, *, observers: Iterable[Observer] = (), clock: Clock | None = None,
                 device: Device | None = None, rules: RuleSet | None = None,
                 notifier: SdNotifier | None = None, output: BinaryIO | None = None,
                 environ: dict[str, str] | None = None,
                 probe: Callable[[str, float, bool], bool] | None = None,
                 budget: Budget | None = None, gpu_pids: Callable[[], list[tuple[str, int]]] | None = None) -> None:
        self.config = config
        self.name = config.name
        self._observers = list(observers)
        self._clock = clock or MonotonicClock()
        self._device = device
        self._rules = rules
        self._notifier = notifier or SdNotifier.from_env()
        self._output = output if output is not None else getattr(sys.stdout, "buffer", None)
        self._environ = dict(os.environ if environ is None else environ)
        self._probe = probe or _probe
        self._probe_pool: ThreadPoolExecutor | None = None
        self._budget = budget or Budget(config.policy)
        self._gpu_pids = gpu_pids
        self._store = StateStore(config.state_dir, config.name)
        self._lock = EngineLock(config.state_dir, config.name)
        self._stop = threading.Event()
        self._wake = threading.Event()   # the watch loop's alarm: a stop request or the engine's exit
        self._stop_reason = ""
        self._state = EngineState.STOPPED
        self._reason = "not started"
        self._record = EngineRecord(name=config.name)
        self._command = EngineCommand.parse(config.engine.command)
        self._plan: Plan | None = None
        self._running: _Running | None = None
        self._ready_sent = False
        self._spawn_error: str | None = None
        self._gpus: GpuView | None = None
        self._pinned: int | None = None   # the KV bytes the running engine was launched pinned to
        self._requested: int | None = None   # the running engine's GPU budget (CUDA total x utilization)
        self._restarts: dict[str, int] = {}     # this run of kvwatch, by failure class
        self._failures: dict[str, int] = {}
        self._corrections: dict[str, int] = {}
        self._status = self._make_status()

    # -- public ------------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def status(self) -> EngineStatus:
        return self._status

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
        try:
            self._startup()
            return self._loop()
        finally:
            if self._running is not None:  # an unexpected error: never leave the engine behind
                self._end_engine()
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
            outcome = self._watch()
            if outcome.kind == STOP:
                self._transition(EngineState.STOPPING, self._stop_reason)
                self._end_engine()
                self._transition(EngineState.STOPPED, f"{self._stop_reason}: engine stopped")
                return EXIT_OK
            self._end_engine()
            delay = self._after_failure(outcome)
            if delay is None:
                return EXIT_GAVE_UP
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
        if record is not None and record.original_argv == configured and record.argv:
            self._record = record
            self._command = EngineCommand(tuple(record.argv))
            if record.argv != configured:
                _LOG.info("state: reusing the corrected command from %s: %s", self._store.path,
                          " ".join(record.argv))
        else:
            if record is not None:
                _LOG.info("state: the engine command changed; earlier corrections do not apply, "
                          "what this host's engine taught (constraints) does")
                self._record = EngineRecord(name=self.name, pids=record.pids, pgid=record.pgid,
                                            constraints=record.constraints)
            self._record.original_argv = configured
            self._record.argv = configured
        self._record.restarts, self._record.failure_counts, self._record.correction_counts = {}, {}, {}
        # What an earlier kvwatch left in the file is history now: this one has launched nothing yet.
        self._record.state, self._record.reason = EngineState.STOPPED.value, "kvwatch started"
        self._record.kvwatch_pid = os.getpid()
        self._record.kvwatch_create_time = (proc_inspect.ref_of(os.getpid()) or ProcRef(0, 0.0)).create_time
        if self._device is None:
            self._device = choose_device(self.config.device)
        if self._rules is None:
            self._rules = ruleset_for(installed_vllm_version())
        self._rules = self._learned_rules(self._rules)
        env = self._engine_env()
        if self.config.learned_dir:   # what another host measured for this profile, unless this host knows
            learned_store.adopt_into(self._record.learned_non_kv, self.config.learned_dir, self._command,
                                     self._device, self._gpu_view().context())
        if self.config.policy.preflight:
            command, fixes, self._plan = preflight(self._command, self._device, self._rules, env,
                                                   self.config.policy, self._record.learned_non_kv)
            if fixes:
                self._record.preflight = list(fixes)
                self._record.constraints += [Constraint(f.kind, f.message, f.change, PREFLIGHT) for f in fixes]
                self._set_command(command)
        else:
            self._plan = plan_for(self._command, self._device, self._rules, env, self._record.learned_non_kv)
        self._save()
        self._publish()

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
        env[leftovers.MARKER_ENV] = leftovers.marker(self.config.state_dir, self.name)
        return env

    def _set_command(self, command: EngineCommand) -> None:
        self._command = command
        self._record.argv = list(command.argv)
        if self._device is not None and self._rules is not None:
            self._plan = plan_for(command, self._device, self._rules, self._engine_env(), self._record.learned_non_kv)

    def _pinned_argv(self) -> list[str]:
        """The command, with --kv-cache-memory-bytes pinned to what the learned plan gives the KV cache
        less the memory other processes hold on the GPU now (engine.pin_kv_cache_memory)."""
        argv = list(self._command.argv)
        self._pinned = None
        device, rules = self._device, self._rules
        if not self.config.engine.pin_kv_cache_memory or device is None or rules is None \
                or self._command.has("--kv-cache-memory-bytes"):
            return argv
        learned = plan_for(self._command, device, rules, self._engine_env(), self._record.learned_non_kv)
        if learned is None or learned.source != "learned":
            _LOG.info("pin: nothing learned yet for this profile: vLLM profiles the memory itself")
            return argv
        foreign = self._gpu_view().foreign_bytes() or 0
        pinned = learned.kv_memory_bytes - foreign
        if pinned < 2 * learned.bytes_per_block:
            _LOG.warning("pin: not pinned: other processes hold %s of the GPU, more than the learned KV cache "
                         "(%s); vLLM profiles the memory itself", format_bytes(foreign),
                         format_bytes(learned.kv_memory_bytes))
            return argv
        _LOG.info("pin: --kv-cache-memory-bytes %d (learned %s%s)", pinned, format_bytes(learned.kv_memory_bytes),
                  f", less {format_bytes(foreign)} other processes hold" if foreign else "")
        self._pinned = pinned
        return [*argv, "--kv-cache-memory-bytes", str(pinned)]

    def _launch(self) -> None:
        argv = self._pinned_argv()
        self._requested = self._requested_bytes()
        if self._pinned is not None and self._device is not None and self._rules is not None:
            # the plan in force is the pinned launch's: exact
            self._plan = plan_for(EngineCommand(tuple(argv)), self._device, self._rules, self._engine_env())
        if argv not in self._record.plans_tried:
            self._record.plans_tried.append(argv)
        self._transition(EngineState.STARTING, f"launching: {' '.join(argv)}")
        try:
            proc = spawn.spawn(argv, self._engine_env(), reaper_grace=min(10.0, self.config.engine.stop_timeout_seconds))
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
        report = leftovers.clean(refs, leftovers.marker(self.config.state_dir, self.name), port, self._gpu_holders,
                                 self.config.engine.stop_timeout_seconds, sleep=self._sleep)
        self._record.foreign = report.foreign
        self._record.pids = []

    def _gpu_holders(self) -> list[tuple[str, int]]:
        if self._gpu_pids is not None:
            return self._gpu_pids()
        return self._gpu_view().holders()

    def _gpu_view(self) -> GpuView:
        if self._gpus is None:
            self._gpus = GpuView(self._device, leftovers.marker(self.config.state_dir, self.name))
        return self._gpus

    # -- watch ---------------------------------------------------------------------------

    def _watch(self) -> _Outcome:
        run = self._running
        if run is None:
            return _Outcome(SPAWN_FAILED, self._spawn_error or "spawn failed")
        cfg = self.config.engine
        tick = min(1.0, cfg.health_interval_seconds)
        probe_timeout = max(1.0, min(5.0, cfg.health_interval_seconds))
        url = self._command.health_url()
        next_probe = run.started
        last_ok = run.started
        ready_since: float | None = None
        ready_line = 0
        stable = False
        while True:
            now = self._clock.now()
            if self._stop.is_set():
                return _Outcome(STOP)
            rc = run.proc.poll()
            if rc is not None:
                return _Outcome(EXIT, f"exited with code {rc}", rc, served=ready_since is not None)
            if now >= next_probe:
                probed = self._probe_unless_interrupted(url, probe_timeout, ready_since is None)
                if probed is None:
                    continue   # a stop request or the engine's exit came first: handled at the top
                ok = probed
                self._refresh_tree()  # before a transition, so its status carries the current pids
                now = self._clock.now()
                # While starting, look every second: a refused connection costs nothing, and READY
                # (and the exporter's view of it) should not lag by a whole health interval.
                next_probe = now + (cfg.health_interval_seconds if ready_since is not None else tick)
                if ready_since is None:
                    if ok:
                        ready_since = last_ok = now
                        ready_line = run.pump.lines_seen
                        self._transition(EngineState.READY, f"serving on {url} after {now - run.started:.0f}s")
                    elif now - run.started > cfg.start_timeout_seconds:
                        return _Outcome(START_TIMEOUT, f"not ready after {cfg.start_timeout_seconds:.0f}s")
                elif ok:
                    last_ok = now
                    if not stable and now - ready_since >= self.config.policy.stable_seconds:
                        stable = True
                        self._budget.stable()
                        _LOG.info("stable: READY for %.0fs; backoff reset", now - ready_since)
                elif (died := self._died_in_log(run.pump.lines_since(ready_line))) is not None:
                    return _Outcome(EXIT, died, served=True)  # no need to wait out hang_timeout
                elif now - last_ok > cfg.hang_timeout_seconds:
                    return _Outcome(HANG, f"/health failed or timed out for {now - last_ok:.0f}s "
                                            f"(hang_timeout {cfg.hang_timeout_seconds:.0f}s)", served=True)
            elif run.ranks.cores:
                self._refresh_tree()  # DP engine cores: every tick, to see which one dies first
            self._refresh_facts()
            self._reap_orphans()
            if not run.proc.reaper_alive():
                _LOG.warning("reaper: gone; starting a new one")
                run.proc.start_reaper()
            self._notifier.watchdog(self._clock.now())
            self._clock.wait(self._wake, tick)  # wakes at once on a stop request or the engine's exit
            self._wake.clear()

    def _probe_unless_interrupted(self, url: str, timeout: float, starting: bool) -> bool | None:
        """The probe's answer, or None when a stop request or the engine's exit comes first: a slow
        or dripping engine (each exchange has its deadline) never holds the watchdog's own stop,
        its timers or the systemd watchdog ping."""
        if self._probe_pool is None:
            self._probe_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvwatch-probe")
        future = self._probe_pool.submit(self._probe, url, timeout, starting)
        while True:
            try:
                return future.result(timeout=0.1)
            except FutureTimeout:
                run = self._running
                if self._stop.is_set() or (run is not None and run.proc.poll() is not None):
                    return None
                self._notifier.watchdog(self._clock.now())
            except Exception as exc:  # a probe never raises; if it does, the engine is not healthy
                _LOG.warning("probe failed: %r", exc)
                return False

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
        if os.getpid() != 1:
            return
        keep = self._running.proc.own_pids if self._running is not None else frozenset()
        for pid in proc_inspect.reap_orphans(keep):
            _LOG.info("reaped: orphan pid %d", pid)

    def _refresh_tree(self, force: bool = False) -> None:
        run = self._running
        if run is None:
            return
        infos = proc_inspect.tree(run.proc.pid, run.proc.pgid)
        for rank in run.ranks.update((p.pid, " ".join(p.cmdline) or p.name) for p in infos):
            _LOG.warning("engine core of data-parallel rank %d (pid %d) is gone while the others run",
                         rank, run.ranks.lost[rank])
        live = frozenset(p.pid for p in infos)
        if not force and live == run.live:
            return
        run.live = live
        run.pid_ranks = ranks_of_tree((p.pid, p.ppid, " ".join(p.cmdline) or p.name) for p in infos)
        known = {r.pid: r for r in run.refs}
        known.update({p.pid: ProcRef(p.pid, p.create_time) for p in infos})
        run.refs = list(known.values())  # stop_group also signals those that left the group
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
        self._learn_non_kv(facts.available_kv_bytes)
        self._save()
        self._publish()

    def _requested_bytes(self) -> int | None:
        """The budget vLLM sizes its memory against: the CUDA total x the utilization it takes (the flag,
        else its release's default), where the plan's device is a CUDA GPU with a known total (None
        elsewhere, or for a utilization vLLM refuses)."""
        device = self._device
        if device is None or device.platform != "cuda" or not device.total_memory_bytes:
            return None
        try:
            settings = self._command.settings()
        except KvwatchError:
            return None
        if not 0 < settings.gpu_memory_utilization <= 1:
            return None
        return requested_bytes(device, settings, installed_version(), self._engine_env())

    def _learn_non_kv(self, available_kv_bytes: int | None) -> None:
        """The engine said what its profile left the KV cache: keep the non-KV memory that implies
        for this profile (model, batch flags, card, vLLM), and refine the plan in force at once.
        A pinned launch profiled nothing: its figure is the pin."""
        requested, device = self._requested, self._device
        if self._pinned is not None:
            return
        if available_kv_bytes is None or requested is None or device is None:
            return
        key = learned_key(self._command, device)
        if key is None:
            return
        learned = self._record.learned_non_kv
        learned.pop(key, None)   # re-inserted last: the oldest profiles go first
        learned[key] = max(0, requested - available_kv_bytes)
        learned_store.publish(self.config.learned_dir, self._command, device, requested, available_kv_bytes)
        for old in list(learned)[:-MAX_LEARNED_PROFILES]:
            del learned[old]
        if self._rules is not None:
            self._plan = plan_for(self._command, device, self._rules, self._engine_env(), learned)

    def _end_engine(self) -> None:
        """Stop the whole group (whatever is left of it), drain the output, forget the pids."""
        run = self._running
        if run is None or run.ended:
            return
        run.ended = True
        spawn.stop_group(run.proc.pgid, self.config.engine.stop_timeout_seconds, leader=run.proc.popen,
                             extra=run.refs, clock=self._clock.now, sleep=self._sleep)
        # A descendant that left the group (double-forked into its own session) still carries
        # the engine's marker: end it too.
        mark = leftovers.marker(self.config.state_dir, self.name)
        escaped = proc_inspect.marked(leftovers.MARKER_ENV, mark)
        if escaped:
            _LOG.warning("stop: ending %d engine process(es) outside its group: %s", len(escaped),
                         [r.pid for r in escaped])
            spawn.kill_processes(escaped, 5.0, self._sleep, marker=(leftovers.MARKER_ENV, mark))
        run.proc.release_reaper()
        if run.pump.join(timeout=10):
            run.proc.close()
        else:
            _LOG.warning("pump %s: output still open after the group ended", self.name)
        _LOG.info("exited: pid %d, code %s", run.proc.pid, run.proc.returncode)
        self._reap_orphans()
        self._record.pids = []
        self._save()

    # -- failure -------------------------------------------------------------------------

    def _after_failure(self, outcome: _Outcome) -> float | None:
        """Diagnose, pick the remedy, count it: the backoff delay, or None after going FATAL."""
        from kvwatch.watchdog import recovery  # here: the diagnosis is loaded only when an engine fails

        run, self._running = self._running, None
        lines = run.pump.lines() if run is not None else []
        lost_rank = next(iter(run.ranks.lost), None) if run is not None else None
        if lost_rank is not None:   # one DP rank's core died first: diagnose by its lines
            lines = lines_of_rank(lines, lost_rank)
        diagnosis = recovery.diagnosis_of(outcome.kind, outcome.detail, lines, outcome.served)
        if lost_rank is not None and run is not None:
            diagnosis = recovery.with_rank(diagnosis, lost_rank, run.ranks.lost[lost_rank])
        failure = recovery.failure_record(diagnosis, outcome.detail, self._command, time.time())
        kind = failure.kind
        _LOG.warning("failed: %s (%s): %s", kind, outcome.detail, failure.evidence)
        self._failures[kind] = self._failures.get(kind, 0) + 1
        self._record.failures.append(failure)

        now = self._clock.now()
        budget = recovery.BudgetState(self._budget.restart_refusal(now), self._budget.correction_refusal())
        decision = recovery.decide(
            diagnosis, self._command, detail=outcome.detail, tried=recovery.tried_plans(self._record.failures),
            budget=budget, policy=self.config.policy, plan=self._plan, gpu=self._gpu_view().context(),
            rules=self._rules, now=time.time())
        if decision.action is recovery.Action.GIVE_UP:
            return self._give_up(decision.reason)
        if decision.action is recovery.Action.RESTART:
            self._budget.take_restart(now)
            self._restarts[kind] = self._restarts.get(kind, 0) + 1
        else:
            assert decision.command is not None and decision.correction is not None
            assert decision.constraint is not None
            self._budget.take_correction()
            self._corrections[kind] = self._corrections.get(kind, 0) + 1
            self._record.corrections.append(decision.correction)
            self._record.constraints.append(decision.constraint)
            if self._rules is not None:
                self._rules = self._learned_rules(self._rules)
            _LOG.warning("corrected: %s: %s (%s)", kind, decision.change.describe(), decision.remedy_reason)
            self._set_command(decision.command)
        reason = decision.reason
        self._sync_counts()
        delay = self._budget.backoff()
        self._transition(EngineState.BACKOFF, f"{reason}; relaunch in {delay:.1f}s")
        return delay

    def _give_up(self, reason: str) -> float | None:
        _LOG.error("gave up: %s", reason)
        self._sync_counts()
        self._transition(EngineState.FATAL, f"gave up: {reason}")
        return None

    def _sync_counts(self) -> None:
        self._record.restarts = dict(self._restarts)
        self._record.failure_counts = dict(self._failures)
        self._record.correction_counts = dict(self._corrections)

    # -- state file and observers ----------------------------------------------------------

    def _save(self) -> None:
        try:
            self._store.save(self._record)
        except OSError as exc:  # a full disk must not take the engine down with it
            _LOG.warning("state: cannot write %s: %s", self._store.path, exc)

    def _make_status(self) -> EngineStatus:
        last = self._record.last_failure()
        return EngineStatus(
            name=self.name, state=self._state, reason=self._reason, plan=self._plan, argv=self._command.argv,
            pids=tuple(int(p["pid"]) for p in self._record.pids),
            pid_ranks=dict(self._running.pid_ranks) if self._running is not None else {},
            restarts=dict(self._restarts), failures=dict(self._failures), corrections=dict(self._corrections),
            last_failure=last.kind if last else None,
            log_kv_tokens=self._record.log_kv_tokens, log_available_kv_bytes=self._record.log_available_kv_bytes,
            log_memory_parts=dict(self._record.log_memory_parts), memory_requested_bytes=self._requested)

    def _publish(self) -> None:
        self._status = status = self._make_status()
        for observer in list(self._observers):
            try:
                observer(status)
            except Exception:  # an observer's bug must not stop the watchdog
                _LOG.exception("observer %r failed", observer)


def _probe(url: str, timeout: float, starting: bool) -> bool:
    """READY needs /health and a readable /metrics; once READY, /health alone is watched."""
    if not engine_http.health(url, timeout):
        return False
    return engine_http.scrape(url, timeout).ok if starting else True
