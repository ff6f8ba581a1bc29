"""What the OS records around one launch, for a crash's words and a clean relaunch (driver).

Before a launch: the engine cgroup's OOM-kill count and the GPUs' used memory. While it runs: the host's
memory (MemAvailable, pressure), judged a sample a tick (host_memory_watch.py), so an engine on a
unified-memory host is stopped before the host wedges. After it ends: the kernel's record of who killed
it (kill_cause.py), and a bounded wait until the GPUs it held are clean (gpu_release.py), since a relaunch
onto a dirty GPU shrinks its pool or fails as gpu_memory_busy. Every read goes through the supervisor's
WatchdogOs and GpuView; nothing here decides a restart.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TYPE_CHECKING

from kvwatch.diagnosis.start_phase import phase_of
from kvwatch.gpu_types import NvmlSnapshot
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.values.host_memory import OomCount
from kvwatch.watchdog.gpu_release import ReleaseOutcome, ReleaseVerdict, baseline_of
from kvwatch.watchdog.gpu_release_wait import wait_for_release
from kvwatch.watchdog.host_memory_watch import HostMemoryLevel, HostMemoryVerdict, HostMemoryWindow, stop_record
from kvwatch.watchdog.kill_cause import kernel_record
from kvwatch.watchdog.launch_watch import LaunchEnd

if TYPE_CHECKING:
    from kvwatch.watchdog.engine_processes import Running
from kvwatch.watchdog.os_interface import WatchdogOs
from kvwatch.watchdog.outcomes import KernelRecord, LaunchOutcome
from kvwatch.watchdog.records import HostMemoryStop

_LOG = logging.getLogger(__name__)
STACKS_KEPT_CHARS = 16 * 1024   # of a stall's stacks, in the state file (the log has the summary)
RELEASE_TIMEOUT_S = 30.0     # at most this long before a relaunch onto GPUs a dead engine still holds


class LaunchEvidence:
    def __init__(self, os: WatchdogOs, snapshot: Callable[[], NvmlSnapshot | None]) -> None:
        self._os = os
        self._snapshot = snapshot            # NVML now; None off CUDA
        self._oom_before: OomCount | None = None
        self._baseline: dict[str, int | None] = {}
        self._memory = HostMemoryWindow()
        self._warned = False
        self.release_waits: dict[str, int] = {}     # by outcome, for the exporter
        self.last_release_wait: float | None = None

    def before_launch(self) -> None:
        self._oom_before = self._os.oom_count()
        snap = self._snapshot()
        self._baseline = baseline_of(snap) if snap is not None and snap.available else {}
        self._memory = HostMemoryWindow()
        self._warned = False

    def kernel_record(self) -> KernelRecord:
        """The kernel's record of the launch that just ended: OOM kills in its cgroup, the host's memory."""
        return kernel_record(self._oom_before, self._os.oom_count(), self._os.host_memory())

    def host_memory(self) -> HostMemoryVerdict | None:
        """The host's memory now, judged over the last samples; a WARN is logged once per launch."""
        sample = self._os.host_memory_sample()
        if sample is None:
            return None
        verdict = self._memory.add(sample)
        if verdict.level is HostMemoryLevel.WARN and not self._warned:
            _LOG.warning("host memory: %s", verdict.reason)
            self._warned = True
        return verdict

    def host_memory_stop(self, lines: Callable[[], list[str]], argv: list[str]) -> HostMemoryStop | None:
        """The record of a stop for host memory when the host's memory says stop now (`lines`: the
        engine's output, for the phase it had come to); None otherwise."""
        verdict = self.host_memory()
        if verdict is None or verdict.level is not HostMemoryLevel.STOP:
            return None
        return stop_record(verdict, phase_of(lines()), argv, self._os.wall_time(), self._os.boot_id())

    def with_stacks(self, end: LaunchEnd, run: Running | None, command: EngineCommand) -> LaunchEnd:
        """A stall, before its restart: the engine's stacks (vLLM's own dump, else py-spy), where they say
        it is stuck in the failure's words, the stacks kept with its record. Bounded; never raises."""
        if end.outcome is not LaunchOutcome.STALLED or run is None:
            return end
        found = self._os.stall_evidence(sorted(run.tree.live | {run.proc.pid}), command)
        if found is None:
            return end
        _LOG.warning("stall: %s", found.summary())
        return replace(end, detail=f"{end.detail}; {found.summary()}", stacks=found.text(STACKS_KEPT_CHARS))

    def wait_gpu_release(self, engine_pids: Collection[int], clock: Callable[[], float],
                         sleep: Callable[[float], object], stopping: Callable[[], bool]) -> ReleaseVerdict | None:
        """Wait, bounded, until the dead engine's GPUs are back to their memory before its launch; None off
        CUDA. The outcome is counted and logged (gpu_release_wait.py logs a timeout as a warning)."""
        if self._snapshot() is None:
            return None

        def snapshot() -> NvmlSnapshot:
            snap = self._snapshot()
            return snap if snap is not None else NvmlSnapshot.unavailable("NVML gone")

        verdict = wait_for_release(snapshot, engine_pids, self._baseline, RELEASE_TIMEOUT_S, clock=clock,
                                   sleep=sleep, stopping=stopping)
        _LOG.info("gpu release: %s", verdict.text)
        if verdict.outcome is not ReleaseOutcome.UNAVAILABLE:
            self.release_waits[verdict.outcome.value] = self.release_waits.get(verdict.outcome.value, 0) + 1
            self.last_release_wait = verdict.elapsed_s
        return verdict
