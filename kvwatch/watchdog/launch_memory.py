"""The KV memory of each launch: the command pinned to what the learned plan gives the KV cache
(engine.pin_kv_cache_memory), the GPU budget the engine sizes against, and what its start-up lines
teach (the KV cache it got, the non-KV memory of its profile, kept per profile and shared with the
fleet; against the last release's after an upgrade). The decisions are pure (memory_learning.py,
vllm_releases/startup_plan.py); the reads go through the supervisor's WatchdogOs.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from kvwatch.diagnosis.startup_lines import LogFacts
from kvwatch.errors import KvwatchError
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.units import format_bytes
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.release_defaults import defaults_for
from kvwatch.vllm_releases.startup_plan import ENABLE_ENV as STARTUP_PLAN_ENV
from kvwatch.vllm_releases.startup_plan import pin_decision, plan_enabled
from kvwatch.vllm_releases.upgrade import ReleaseChange
from kvwatch.watchdog.config import Config
from kvwatch.watchdog.memory_learning import pin_costs_extensible, pin_for, remember_non_kv
from kvwatch.watchdog.os_interface import WatchdogOs
from kvwatch.watchdog.plan_in_force import PlanInForce
from kvwatch.watchdog.preflight import learned_key, utilization_beside_others
from kvwatch.watchdog.state_store import EngineRecord

_LOG = logging.getLogger(__name__)


class LaunchMemory:
    def __init__(self, config: Config, os: WatchdogOs, foreign_bytes: Callable[[], int | None],
                 env: Callable[[], dict[str, str]]) -> None:
        self._config = config
        self._os = os
        self._foreign_bytes = foreign_bytes   # what other processes hold on the engine's GPU now
        self._env = env
        self.pinned: int | None = None      # the KV bytes the running engine was launched pinned to
        self.requested: int | None = None   # the running engine's GPU budget (CUDA total x utilization)
        self.upgrade: ReleaseChange | None = None   # a release change, until the new release measured its cache
        self.release_changes = 0   # the engine's vLLM release differed from the state file's

    def note_upgrade(self, change: ReleaseChange | None) -> None:
        """The vLLM release changed since the last launch: its capacity is compared once the engine says it."""
        if change is not None:
            self.release_changes += 1
            self.upgrade = change

    def prepare(self, command: EngineCommand, planner: PlanInForce, record: EngineRecord) -> list[str]:
        """A launch's command (pinned where the policy says so), with the plan in force computed for it."""
        planner.begin_launch()   # config.json read once for this launch
        self.pinned = None
        planner.compute(command, record.learned_non_kv)
        argv = self._pinned_argv(command, planner, record)
        if self.pinned is None:   # 0.34's extensible cache takes all that is free: leave others theirs
            try:
                room = utilization_beside_others(command, planner.device, self._foreign_bytes() or 0,
                                                 self._config.policy)
            except KvwatchError:   # a command the release cannot read: launched as given, vLLM says why
                room = None
            if room is not None:
                _LOG.warning("launch: other processes hold the GPU: %s (vLLM's extensible KV cache would take "
                             "what they need)", room.describe())
                argv = list(room.apply(EngineCommand(tuple(argv), command.release)).argv)
        self.requested = planner.requested_bytes(command)
        if self.pinned is not None:
            planner.compute(EngineCommand(tuple(argv), command.release))   # the plan in force is the pinned launch's: exact
        return argv

    def _pinned_argv(self, command: EngineCommand, planner: PlanInForce, record: EngineRecord) -> list[str]:
        """The command, with --kv-cache-memory-bytes pinned to what the learned plan (the plan in force
        before the pin) gives the KV cache less the memory other processes hold on the GPU now
        (engine.pin_kv_cache_memory)."""
        argv = list(command.argv)
        if not self._config.engine.pin_kv_cache_memory or command.has("--kv-cache-memory-bytes"):
            return argv
        learned = planner.plan
        if learned is None or learned.source != "learned":
            _LOG.info("pin: nothing learned yet for this profile: vLLM profiles the memory itself")
            return argv
        decision = pin_decision(plan_enabled(defaults_for(self._os.installed_vllm() or DEFAULT_RELEASE),
                                             self._env().get(STARTUP_PLAN_ENV)),
                                learned.kv_memory_bytes, self._os.read_persisted_plan(record.vllm_startup_plan))
        if not decision.pin:
            _LOG.info("pin: %s", decision.reason)
            return argv
        foreign = self._foreign_bytes() or 0
        version = self._os.installed_vllm() or DEFAULT_RELEASE
        try:
            extensible = pin_costs_extensible(command.settings(), planner.device.platform, version)
        except KvwatchError:
            extensible = False
        pin = pin_for(learned, foreign, extensible=extensible)
        if pin.kv_bytes is None:
            _LOG.info("pin: not pinned: %s", pin.why)
            return argv
        _LOG.info("pin: --kv-cache-memory-bytes %d (learned %s%s)", pin.kv_bytes, format_bytes(learned.kv_memory_bytes),
                  f", less {format_bytes(foreign)} other processes hold" if foreign else "")
        self.pinned = pin.kv_bytes
        return [*argv, "--kv-cache-memory-bytes", str(pin.kv_bytes)]

    def note_facts(self, facts: LogFacts, record: EngineRecord, command: EngineCommand,
                   planner: PlanInForce | None) -> bool:
        """The engine's start-up lines into the record; True when they said something new."""
        parts = facts.memory_parts()
        if (facts.kv_tokens, facts.available_kv_bytes, parts) == (record.log_kv_tokens, record.log_available_kv_bytes,
                                                                  record.log_memory_parts):
            return False
        record.log_kv_tokens = facts.kv_tokens
        record.log_available_kv_bytes = facts.available_kv_bytes
        record.log_memory_parts = parts
        record.vllm_startup_plan = facts.startup_plan_path or record.vllm_startup_plan
        if self.upgrade is not None and facts.kv_tokens is not None:   # capacity against the last release's
            _LOG.warning("release: %s", self.upgrade.capacity_message(facts.kv_tokens, facts.kv_cache_bytes)
                         or f"vLLM {self.upgrade.after}: {facts.kv_tokens:,} KV tokens")
            self.upgrade = None
        # A boot on vLLM's own plan logs no profile: its plan is the figure.
        # From 0.34 the profile's figure is tentative until the cache is sized after warm-up: never learned.
        extensible = defaults_for(self._os.installed_vllm() or DEFAULT_RELEASE).extensible is not None
        self._learn_non_kv(facts.settled_kv_bytes if extensible else facts.kv_cache_bytes, record, command, planner)
        return True

    def _learn_non_kv(self, available_kv_bytes: int | None, record: EngineRecord, command: EngineCommand,
                      planner: PlanInForce | None) -> None:
        """The engine said what its profile left the KV cache: keep the non-KV memory that implies
        for this profile (model, batch flags, card, vLLM), and refine the plan in force at once.
        A pinned launch profiled nothing: its figure is the pin."""
        requested = self.requested
        if self.pinned is not None:
            return
        if available_kv_bytes is None or requested is None or planner is None:
            return
        key = learned_key(command, planner.device)
        if key is None:
            return
        remember_non_kv(record.learned_non_kv, key, requested, available_kv_bytes)
        self._os.publish_learned(self._config.learned_dir, command, planner.device, requested, available_kv_bytes)
        planner.compute(command, record.learned_non_kv)
