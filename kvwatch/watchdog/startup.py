"""kvwatch's start, before the first launch: reconcile the state file an earlier kvwatch left with the
configuration (which command, what of the record holds, an image upgrade, a stop for host memory),
then plan the first launch (the learned rules and profiles, the preflight's certain fixes).

The decisions are pure: the command is next_command.py's, the rest reconcile.py's and recovery.py's;
this class reads what they need through the supervisor's WatchdogOs and says what it found.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kvwatch.diagnosis import GpuContext
from kvwatch.engine_status import EngineState
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.rules import RuleSet, ruleset_for
from kvwatch.vllm_releases.upgrade import ReleaseChange, release_change
from kvwatch.watchdog import reconcile, recovery
from kvwatch.watchdog.config import Config
from kvwatch.watchdog.host_memory_watch import describe_stop
from kvwatch.watchdog.next_command import AtStart, Preflighted, Recovered, Source, next_command
from kvwatch.watchdog.os_interface import WatchdogOs
from kvwatch.watchdog.plan_in_force import PlanInForce
from kvwatch.watchdog.preflight import preflight
from kvwatch.watchdog.records import PREFLIGHT, Constraint
from kvwatch.watchdog.state_store import EngineRecord

_LOG = logging.getLogger(__name__)


@dataclass
class Reconciled:
    record: EngineRecord                 # the record this kvwatch goes on with
    command: EngineCommand               # the command in force
    upgrade: ReleaseChange | None        # the vLLM release changed since the last launch


class Startup:
    def __init__(self, config: Config, os: WatchdogOs, state_path: str,
                 env: Callable[[], dict[str, str]]) -> None:
        self._config = config
        self._os = os
        self._state_path = state_path
        self._env = env

    def reconcile(self, loaded: EngineRecord | None, configured: EngineCommand,
                  fresh: EngineRecord) -> Reconciled:
        """The record and command to go on with, from the state file's record (`loaded`, None when there
        is none), the configured command and the record of a first start (`fresh`)."""
        argv = list(configured.argv)
        nxt = next_command(configured, AtStart(loaded.original_argv if loaded else None,
                                               loaded.argv if loaded else None, self._config.policy.fixed_flags))
        assert nxt.command is not None
        if nxt.source is Source.REFUSED:
            _LOG.warning("state: %s holds a command kvwatch did not write (%s): not launched; launching the "
                         "configured command", self._state_path, nxt.reason)
        if loaded is not None and nxt.source is Source.PERSISTED:
            record = loaded
            if loaded.argv != argv:
                _LOG.info("state: reusing the corrected command from %s: %s", self._state_path, " ".join(loaded.argv))
        else:
            record = fresh
            if loaded is not None:
                _LOG.info("state: the engine command changed; earlier corrections do not apply, "
                          "what this host's engine taught (constraints) does")
                record = EngineRecord(name=fresh.name, pids=loaded.pids, pgid=loaded.pgid,
                                      engine_proof=loaded.engine_proof, constraints=loaded.constraints,
                                      autopilot_changes=loaded.autopilot_changes,
                                      autopilot_rolled_back=loaded.autopilot_rolled_back)
            record.original_argv = argv
            record.argv = argv
        upgrade = self._note_release(loaded, record)
        command = self._after_host_memory_stop(record, nxt.command)
        record.restarts, record.failure_counts, record.correction_counts = {}, {}, {}
        record.autopilot_counts = {}
        # What an earlier kvwatch left in the file is history now: this one has launched nothing yet.
        record.state, record.reason = EngineState.STOPPED.value, "kvwatch started"
        own = self._os.own_ref()
        record.kvwatch_pid, record.kvwatch_create_time = own.pid, own.create_time
        return Reconciled(record, command, upgrade)

    def plan(self, record: EngineRecord, command: EngineCommand, device: Device, rules: RuleSet | None,
             gpu: Callable[[], GpuContext | None]) -> tuple[PlanInForce, EngineCommand]:
        """The plan in force for the first launch, and its command after the preflight's certain fixes
        (`rules`: the rule table given, else the installed release's)."""
        if rules is None:
            rules = ruleset_for(self._os.installed_vllm_text())
        planner = PlanInForce(device, reconcile.learned_rules(rules, record.constraints), self._env)
        if self._config.learned_dir:   # what another host measured for this profile, unless this host knows
            self._os.adopt_learned(record.learned_non_kv, self._config.learned_dir, command, planner.device, gpu())
        if self._config.policy.preflight:
            fixed, fixes, _ = preflight(command, planner.device, planner.rules, self._env(), self._config.policy,
                                        record.learned_non_kv, planner.model)
            nxt = next_command(command, Preflighted(fixed, bool(fixes)))
            if nxt.source is Source.PREFLIGHT and nxt.command is not None:
                record.preflight = list(fixes)
                record.constraints += [Constraint(f.kind, f.message, f.change, PREFLIGHT) for f in fixes]
                command = nxt.command
                record.argv = list(command.argv)
        planner.compute(command, record.learned_non_kv)
        return planner, command

    def _note_release(self, last: EngineRecord | None, record: EngineRecord) -> ReleaseChange | None:
        """An image upgrade: the release recorded at the last launch is not the one installed now."""
        current = self._os.installed_vllm_text()
        change = release_change(last.vllm_release if last else None, current,
                                last.log_kv_tokens if last else None, last.log_available_kv_bytes if last else None)
        if change is not None:
            _LOG.warning("release: %s", change.message)
        record.vllm_release = current or record.vllm_release
        return change

    def _after_host_memory_stop(self, record: EngineRecord, command: EngineCommand) -> EngineCommand:
        """A stop for host memory that no failure followed (the host wedged or rebooted first): said, counted
        as the host OOM it was, and this start re-plans with less host memory rather than repeat it."""
        stop = reconcile.unfollowed_stop(record.host_memory_stops, record.failures)
        if stop is None:
            return command
        said = describe_stop(stop, self._os.boot_id())
        _LOG.warning("state: %s", said)
        record.failures.append(reconcile.stop_failure(stop, said))
        if list(stop.argv) != list(command.argv):
            return command
        decision = recovery.decide(reconcile.stop_diagnosis(stop, said), command,
                                   tried=recovery.tried_plans(record.failures), policy=self._config.policy,
                                   now=self._os.wall_time())
        nxt = next_command(command, Recovered(decision))
        if nxt.source is not Source.CORRECTED or nxt.command is None or decision.correction is None:
            return command
        _LOG.warning("corrected: host_oom: %s (%s)", decision.change.describe(), decision.remedy_reason)
        record.corrections.append(decision.correction)
        record.argv = list(nxt.command.argv)
        return nxt.command
