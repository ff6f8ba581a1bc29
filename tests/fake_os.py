"""A fake of the watchdog's OS (kvwatch.watchdog.os_interface.WatchdogOs) and of its clock, for the
supervisor's transition tests: no child process, no signal, no sleep.

Each launch plays one `Launch` script on the fake clock: it becomes healthy after `ready_after`
seconds, stops answering after `unhealthy_after`, and writes `log` then exits with `exit_code` after
`exit_after`. Its stdout is a real pipe (the supervisor's OutputPump reads it as it would an engine's),
written by the fake. Time passes only when the supervisor waits or sleeps. With `load`, the running
engine's /metrics (`scrape`) reports the counters that function gives for its command and age.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvwatch.boundary import device_probe
from kvwatch.boundary.engine_http import EngineLoad, EngineMetrics
from kvwatch.boundary.proc_inspect import ProcInfo, ProcRef
from kvwatch.diagnosis import GpuContext
from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.values.host_memory import HostMemory, HostMemorySample, OomCount
from kvwatch.values.versions import VllmVersion, parse_version
from kvwatch.vllm_releases.startup_plan import PersistedPlan
from kvwatch.watchdog.leftovers import CleanupReport
from kvwatch.watchdog.ownership import EngineProof
from kvwatch.watchdog.stall_evidence import StallEvidence


@dataclass(frozen=True)
class Launch:
    ready_after: float | None = None      # healthy from then on (None: never)
    unhealthy_after: float | None = None  # /health stops answering (a hang)
    exit_after: float | None = None       # exits then (None: runs until stopped)
    exit_code: int = 1
    log: str = ""                         # written just before it exits
    spawn_error: bool = False             # the command cannot be started (OSError)
    at_stop: str = ""                     # the engine's other processes say this when kvwatch's stop signals them


class FakeClock:
    """Monotonic time that moves only when the supervisor waits or sleeps; `at(t, fn)` runs fn then."""

    def __init__(self) -> None:
        self.t = 100.0
        self._due: list[tuple[float, Callable[[], None]]] = []
        self.on_advance: Callable[[float], None] = lambda now: None

    def now(self) -> float:
        return self.t

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._due.append((when, action))

    def _advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)
        for item in [d for d in self._due if d[0] <= self.t]:
            self._due.remove(item)
            item[1]()
        self.on_advance(self.t)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        self._advance(seconds)
        return event.is_set()

    def sleep(self, seconds: float) -> None:
        self._advance(seconds)


class FakeEngine:
    """One spawned engine (kvwatch.watchdog.os_interface.EngineHandle) playing its Launch."""

    def __init__(self, pid: int, script: Launch, started: float, argv: Sequence[str] = ()) -> None:
        self.pid = self.pgid = pid
        self.create_time = 1.0
        self.argv = tuple(argv)
        self.script = script
        self.started = started
        self._read, self._write = os.pipe()
        self._rc: int | None = None
        self._callbacks: list[Callable[[], None]] = []
        self.stopped = False

    @property
    def stdout(self) -> int:
        return self._read

    @property
    def returncode(self) -> int | None:
        return self._rc

    @property
    def own_pids(self) -> frozenset[int]:
        return frozenset({self.pid})

    def poll(self) -> int | None:
        return self._rc

    def on_exit(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def reaper_alive(self) -> bool:
        return True

    def start_reaper(self) -> None:
        pass

    def release_reaper(self) -> None:
        pass

    def close(self) -> None:
        os.close(self._read)

    def close_output(self) -> None:
        if self._write >= 0:
            os.close(self._write)   # EOF: the pump ends
            self._write = -1

    def healthy(self, now: float) -> bool:
        s, age = self.script, now - self.started
        if self._rc is not None or s.ready_after is None or age < s.ready_after:
            return False
        return s.unhealthy_after is None or age < s.unhealthy_after

    def play(self, now: float) -> None:
        if self._rc is None and self.script.exit_after is not None and now - self.started >= self.script.exit_after:
            self.exit(self.script.exit_code, self.script.log)

    def exit(self, code: int, log: str = "") -> None:
        if self._rc is not None:
            return
        if log:
            os.write(self._write, log.encode())
        if not self.script.at_stop:   # else its other processes hold the pipe open until the stop
            self.close_output()
        self._rc = code
        for callback in self._callbacks:
            callback()


@dataclass
class FakeOs:
    """The watchdog's OS: launches play `scripts` in turn (the last one again when they run out)."""

    clock: FakeClock
    scripts: Sequence[Launch]
    spawned: list[list[str]] = field(default_factory=list)
    engines: list[FakeEngine] = field(default_factory=list)
    stops: int = 0
    load: Callable[[tuple[str, ...], float], EngineLoad] | None = None   # (argv, age) -> the engine's series
    wall_base: float = 1_700_000_000.0
    oom_counts: list[OomCount] = field(default_factory=list)          # each read takes the next; then None
    memory_samples: list[HostMemorySample] = field(default_factory=list)   # likewise, one a tick
    stall_found: StallEvidence | None = None    # what a look at a stalled engine's stacks finds
    stall_looks: list[list[int]] = field(default_factory=list)
    vllm_text: str | None = None          # the installed vLLM it reports (None: the host's own, as the planner reads)
    persisted_plans: dict[str, PersistedPlan] = field(default_factory=dict)   # vLLM's start-up plans by path
    learned: dict[str, int] = field(default_factory=dict)   # the fleet's learned store: non-KV bytes by profile
    published: list[tuple[tuple[str, ...], int, int]] = field(default_factory=list)   # (argv, requested, available)
    listeners: dict[int, list[int | None]] = field(default_factory=dict)   # port -> pids listening on it

    def __post_init__(self) -> None:
        self.clock.on_advance = self._play

    def _play(self, now: float) -> None:
        if self.engines:
            self.engines[-1].play(now)

    def probe(self, url: str, timeout: float, starting: bool) -> bool:
        """The supervisor's health probe, answered by the running engine's script."""
        return bool(self.engines) and self.engines[-1].healthy(self.clock.now())

    def scrape(self, url: str, timeout: float = 3.0) -> EngineMetrics:
        """The running engine's /metrics (kvwatch.boundary.engine_http.scrape's place), from `load`."""
        now = self.clock.now()
        if not self.engines or self.load is None or not self.engines[-1].healthy(now):
            return EngineMetrics.failed("connection refused")
        engine = self.engines[-1]
        return EngineMetrics(True, load=self.load(engine.argv, now - engine.started))

    # -- WatchdogOs -------------------------------------------------------------------

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], reaper_grace: float) -> FakeEngine:
        script = self.scripts[min(len(self.spawned), len(self.scripts) - 1)]
        self.spawned.append(list(argv))
        if script.spawn_error:
            raise OSError(2, "No such file or directory")
        engine = FakeEngine(5000 + len(self.spawned), script, self.clock.now(), argv)
        self.engines.append(engine)
        engine.play(self.clock.now())
        return engine

    def stop_group(self, engine: FakeEngine, timeout: float, extra: Iterable[ProcRef],  # type: ignore[override]
                   clock: Callable[[], float], sleep: Callable[[float], None]) -> bool:
        self.stops += 1
        engine.stopped = True
        if engine.script.at_stop:
            os.write(engine._write, engine.script.at_stop.encode())
            engine.close_output()
        engine.exit(-15)
        return True

    def tree(self, engine: FakeEngine) -> list[ProcInfo]:  # type: ignore[override]
        if engine.poll() is not None:
            return []
        return [ProcInfo(engine.pid, 1, engine.pgid, "vllm", 1.0, None, ("vllm", "serve"))]

    def proof(self, engine: FakeEngine) -> EngineProof | None:  # type: ignore[override]
        return EngineProof(engine.pid, engine.create_time, engine.pgid, engine.pid, 1000)

    def owned(self, proof: EngineProof | None, recorded: Iterable[ProcRef],
              skip: Iterable[int]) -> list[tuple[ProcRef, str]]:
        return []

    def end_owned(self, proof: EngineProof | None, recorded: Iterable[ProcRef], timeout: float,
                  sleep: Callable[[float], None], skip: Iterable[int],
                  others: Callable[[], frozenset[int]] = frozenset) -> tuple[list[int], list[str]]:
        return [], []

    def clean_leftovers(self, refs: list[ProcRef], proof: EngineProof | None, port: int | None,
                        gpu_holders: Callable[[], Iterable[tuple[str, int]]], timeout: float,
                        sleep: Callable[[float], None], others: Callable[[], frozenset[int]] = frozenset) -> CleanupReport:
        return CleanupReport()

    def port_listeners(self, port: int) -> list[int | None]:
        return list(self.listeners.get(port, []))

    def reap_orphans(self, keep: frozenset[int]) -> list[int]:
        return []

    def cpu_seconds(self, pids: Iterable[int]) -> float | None:
        return None

    def own_ref(self) -> ProcRef:
        return ProcRef(4242, 1.0)

    def wall_time(self) -> float:
        return self.wall_base + self.clock.now()

    def oom_count(self) -> OomCount | None:
        return self.oom_counts.pop(0) if self.oom_counts else None

    def host_memory(self) -> HostMemory | None:
        return HostMemory(24 << 30, None)

    def host_memory_sample(self) -> HostMemorySample | None:
        return self.memory_samples.pop(0) if self.memory_samples else None

    def boot_id(self) -> str:
        return "fake-boot"

    def stall_evidence(self, pids: Sequence[int], command: EngineCommand) -> StallEvidence | None:
        self.stall_looks.append(sorted(pids))
        return self.stall_found

    def installed_vllm(self) -> VllmVersion | None:
        if self.vllm_text is None:
            return device_probe.installed_vllm()
        try:
            return parse_version(self.vllm_text)
        except KvwatchError:
            return None

    def installed_vllm_text(self) -> str | None:
        return self.vllm_text if self.vllm_text is not None else device_probe.installed_vllm_text()

    def read_persisted_plan(self, path: str | None) -> PersistedPlan | None:
        return self.persisted_plans.get(path) if path else None

    def adopt_learned(self, learned: dict[str, int], directory: str, command: EngineCommand,
                      device: Device | None, gpu: GpuContext | None) -> None:
        for key, non_kv in self.learned.items():
            learned.setdefault(key, non_kv)

    def publish_learned(self, directory: str, command: EngineCommand, device: Device | None,
                        requested_bytes: int, available_kv_bytes: int) -> None:
        if directory:
            self.published.append((command.argv, requested_bytes, available_kv_bytes))
