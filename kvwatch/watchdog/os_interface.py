"""Everything the supervisor asks of the operating system, behind one injected object (after
supervisord's `options`): spawn the engine, stop its group, read its process tree, find and end what
is left of earlier engines, reap orphans as PID 1, the wall clock, and what the supervisor reads of the
host beside the engine: the installed vLLM release, the engine's /metrics, vLLM's persisted start-up
plan and the learned-profile store shared by a fleet.

`RealOs` does it through kvwatch.boundary (spawn.py, proc_inspect.py, escalation.py) and leftovers.py;
tests give the supervisor a fake (tests/fake_os.py) and run every transition without a child process.
The monotonic clock and its waits stay the supervisor's Clock: they are time, not the OS.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from kvwatch.boundary import device_probe, engine_http, host_memory, oom_record, proc_inspect, spawn
from kvwatch.boundary.engine_http import EngineMetrics
from kvwatch.boundary.proc_inspect import ProcInfo, ProcRef
from kvwatch.boundary.startup_plan_file import read_persisted_plan
from kvwatch.diagnosis import GpuContext
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.values.host_memory import HostMemory, HostMemorySample, OomCount
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.release_defaults import defaults_for
from kvwatch.vllm_releases.startup_plan import PersistedPlan
from kvwatch.watchdog import disk_writer, learned_store, leftovers
from kvwatch.watchdog.leftovers import CleanupReport
from kvwatch.watchdog.outcomes import signal_of
from kvwatch.watchdog.ownership import EngineProof
from kvwatch.watchdog.stall_evidence import StallEvidence, stall_evidence

_LOG = logging.getLogger(__name__)
STALL_STACKS_TIMEOUT_S = 10.0   # a stall's restart waits at most this long for the engine's stacks

Sleep = Callable[[float], None]


def probe_engine(url: str, timeout: float, starting: bool) -> bool:
    """The supervisor's health probe: READY needs /health and a readable /metrics; once READY, /health
    alone is watched."""
    if not engine_http.health(url, timeout):
        return False
    return engine_http.scrape(url, timeout).ok if starting else True


def signal_name(returncode: int | None) -> str:
    """The name of the signal that ended a process (SIGKILL, ...), "" when it exited by itself."""
    number = signal_of(returncode)
    if number is None:
        return ""
    try:
        return signal.Signals(number).name
    except ValueError:
        return ""


class EngineHandle(Protocol):
    """One spawned engine, as the supervisor holds it (kvwatch.boundary.spawn.EngineProcess)."""

    pid: int
    pgid: int
    create_time: float

    @property
    def stdout(self) -> int: ...          # the read end of its stdout+stderr pipe
    @property
    def returncode(self) -> int | None: ...
    @property
    def own_pids(self) -> frozenset[int]: ...   # children kvwatch waits for itself (engine, reaper)
    def poll(self) -> int | None: ...
    def on_exit(self, callback: Callable[[], None]) -> None: ...
    def reaper_alive(self) -> bool: ...
    def start_reaper(self) -> None: ...
    def release_reaper(self) -> None: ...
    def close(self) -> None: ...


class WatchdogOs(Protocol):
    def spawn(self, argv: Sequence[str], env: Mapping[str, str], reaper_grace: float) -> EngineHandle:
        """Start the engine in its own session and group, with its reaper; OSError when it cannot."""
    def stop_group(self, engine: EngineHandle, timeout: float, extra: Iterable[ProcRef],
                   clock: Callable[[], float], sleep: Sleep) -> bool:
        """SIGTERM, a grace period, SIGKILL to the engine's group and `extra`; True when none is left."""
    def tree(self, engine: EngineHandle) -> list[ProcInfo]:
        """The engine's processes now: its descendants and its group's members."""
    def proof(self, engine: EngineHandle) -> EngineProof | None:
        """What proves a process the engine's, read once at spawn (ownership.py); None if it is gone."""
    def owned(self, proof: EngineProof | None, recorded: Iterable[ProcRef],
              skip: Iterable[int]) -> list[tuple[ProcRef, str]]:
        """The processes on the host proven the engine's now, each with its proof."""
    def end_owned(self, proof: EngineProof | None, recorded: Iterable[ProcRef], timeout: float, sleep: Sleep,
                  skip: Iterable[int], others: Callable[[], frozenset[int]] = frozenset) -> tuple[list[int], list[str]]:
        """End what is proven the engine's (also what left its group); the pids ended and the
        lookalikes not provably its own (reported, left alone; `others`: pids other kvwatch claim)."""
    def clean_leftovers(self, refs: list[ProcRef], proof: EngineProof | None, port: int | None,
                        gpu_holders: Callable[[], Iterable[tuple[str, int]]], timeout: float,
                        sleep: Sleep, others: Callable[[], frozenset[int]] = frozenset) -> CleanupReport:
        """Before a launch: end what is left of our earlier engines, report anyone else's."""
    def port_listeners(self, port: int) -> list[int | None]:
        """Pids listening on `port` now (None: one whose owner we cannot see)."""
    def reap_orphans(self, keep: frozenset[int]) -> list[int]:
        """As PID 1 (a container's entrypoint), reap the orphans re-parented to us; [] otherwise."""
    def cpu_seconds(self, pids: Iterable[int]) -> float | None:
        """The CPU time the pids have used (the stall detector's sign of compute on a CPU backend)."""
    def own_ref(self) -> ProcRef:
        """kvwatch's own process (pid and start time), for the state file."""
    def wall_time(self) -> float:
        """The wall clock (seconds since the epoch), for the records people read."""

    def oom_count(self) -> OomCount | None:
        """The OOM-kill count of the cgroup the engine runs in (kvwatch's own: the engine is spawned there)."""

    def host_memory(self) -> HostMemory | None:
        """The host's memory and the engine cgroup's limit, for the words of a host OOM."""

    def host_memory_sample(self) -> HostMemorySample | None:
        """MemAvailable and memory pressure now."""

    def stall_evidence(self, pids: Sequence[int], command: EngineCommand) -> StallEvidence | None:
        """A stalled engine's stacks and where they say it is stuck (bounded; None: not looked)."""

    def boot_id(self) -> str:
        """This boot's id: a record of a stop for host memory says whether the host rebooted since."""

    def installed_vllm(self) -> VllmVersion | None:
        """The installed vLLM's release, parsed (None: none, or one kvwatch does not read)."""

    def installed_vllm_text(self) -> str | None:
        """The installed vLLM's version as its package metadata spells it."""

    def scrape(self, url: str, timeout: float) -> EngineMetrics:
        """The engine's /metrics page, read once within `timeout`."""

    def read_persisted_plan(self, path: str | None) -> PersistedPlan | None:
        """vLLM's persisted start-up plan at `path`, when vLLM would apply it."""

    def adopt_learned(self, learned: dict[str, int], directory: str, command: EngineCommand,
                      device: Device | None, gpu: GpuContext | None) -> None:
        """Add what another host measured for this launch's profile to `learned`, unless it has one."""

    def publish_learned(self, directory: str, command: EngineCommand, device: Device | None,
                        requested_bytes: int, available_kv_bytes: int) -> None:
        """Share what this host's engine measured for its profile (never fatal)."""


class RealOs:
    """The watchdog's OS, through kvwatch.boundary."""

    def __init__(self) -> None:
        self._cgroup: oom_record.MemoryCgroup | None = None
        self._cgroup_read = False

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], reaper_grace: float) -> EngineHandle:
        return spawn.spawn(argv, env, reaper_grace=reaper_grace)

    def stop_group(self, engine: EngineHandle, timeout: float, extra: Iterable[ProcRef],
                   clock: Callable[[], float], sleep: Sleep) -> bool:
        leader = getattr(engine, "popen", None)   # reaped while stopping, else a zombie member of the group
        return spawn.stop_group(engine.pgid, timeout, leader=leader, extra=extra, clock=clock, sleep=sleep)

    def tree(self, engine: EngineHandle) -> list[ProcInfo]:
        found = proc_inspect.tree(engine.pid, engine.pgid)
        adopter = leftovers.adopter()
        if adopter is None:
            return found
        # Orphans of the engine re-parented to kvwatch (its child subreaper): the engine's too, and
        # recorded with its tree, so that the next kvwatch proves them after a kill -9 of this one.
        seen = {p.pid for p in found} | disk_writer.helper_pids()   # kvwatch's own children, not the engine's
        for info in proc_inspect.children_of(adopter):
            if info.pid not in seen and info.pid not in engine.own_pids and info.create_time >= engine.create_time:
                found += [info, *(c for c in proc_inspect.tree(info.pid) if c.pid not in seen and c.pid != info.pid)]
                seen |= {p.pid for p in found}
        return found

    def proof(self, engine: EngineHandle) -> EngineProof | None:
        return leftovers.proof_of(engine.pid, engine.pgid, engine.create_time)

    def owned(self, proof: EngineProof | None, recorded: Iterable[ProcRef],
              skip: Iterable[int]) -> list[tuple[ProcRef, str]]:
        found = leftovers.scan(proof, recorded, skip)
        return [(ref, found.judged[ref.pid].why) for ref in found.owned]

    def end_owned(self, proof: EngineProof | None, recorded: Iterable[ProcRef], timeout: float, sleep: Sleep,
                  skip: Iterable[int], others: Callable[[], frozenset[int]] = frozenset) -> tuple[list[int], list[str]]:
        return leftovers.end_owned(proof, recorded, timeout, sleep, skip, others())

    def clean_leftovers(self, refs: list[ProcRef], proof: EngineProof | None, port: int | None,
                        gpu_holders: Callable[[], Iterable[tuple[str, int]]], timeout: float,
                        sleep: Sleep, others: Callable[[], frozenset[int]] = frozenset) -> CleanupReport:
        return leftovers.clean(refs, proof, port, gpu_holders, timeout, sleep=sleep, others=others())

    def port_listeners(self, port: int) -> list[int | None]:
        return proc_inspect.listening_on(port)

    def reap_orphans(self, keep: frozenset[int]) -> list[int]:
        if os.getpid() != 1 and not spawn.is_subreaper():
            return []
        return proc_inspect.reap_orphans(keep)

    def cpu_seconds(self, pids: Iterable[int]) -> float | None:
        return proc_inspect.cpu_seconds(pids)

    def own_ref(self) -> ProcRef:
        return proc_inspect.ref_of(os.getpid()) or ProcRef(os.getpid(), 0.0)

    def wall_time(self) -> float:
        return time.time()

    def _memory_cgroup(self) -> oom_record.MemoryCgroup | None:
        if not self._cgroup_read:   # read once: kvwatch does not move between cgroups
            self._cgroup, self._cgroup_read = oom_record.memory_cgroup("self"), True
        return self._cgroup

    def oom_count(self) -> OomCount | None:
        return oom_record.read_oom_count(self._memory_cgroup())

    def host_memory(self) -> HostMemory | None:
        return oom_record.host_memory(self._memory_cgroup())

    def host_memory_sample(self) -> HostMemorySample | None:
        return host_memory.read_sample()

    def boot_id(self) -> str:
        return host_memory.boot_id()

    def installed_vllm(self) -> VllmVersion | None:
        return device_probe.installed_vllm()

    def installed_vllm_text(self) -> str | None:
        return device_probe.installed_vllm_text()

    def scrape(self, url: str, timeout: float) -> EngineMetrics:
        return engine_http.scrape(url, timeout)

    def read_persisted_plan(self, path: str | None) -> PersistedPlan | None:
        schema = defaults_for(self.installed_vllm() or DEFAULT_RELEASE).startup_plan_schema   # 2 from 0.34
        return read_persisted_plan(path, schema)

    def adopt_learned(self, learned: dict[str, int], directory: str, command: EngineCommand,
                      device: Device | None, gpu: GpuContext | None) -> None:
        learned_store.adopt_into(learned, directory, command, device, gpu)

    def publish_learned(self, directory: str, command: EngineCommand, device: Device | None,
                        requested_bytes: int, available_kv_bytes: int) -> None:
        learned_store.publish(directory, command, device, requested_bytes, available_kv_bytes)

    def stall_evidence(self, pids: Sequence[int], command: EngineCommand) -> StallEvidence | None:
        return stall_evidence(pids, command, timeout=STALL_STACKS_TIMEOUT_S)
