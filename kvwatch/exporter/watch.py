"""The watch loop: each interval, one snapshot of every source, swapped in atomically.

Sources are injected, so tests and both commands (`kvwatch run`, `kvwatch export`) wire
their own: the engines (a callable returning EngineTargets), NVML (a callable returning
an NvmlSnapshot, e.g. ``shared().snapshot``) and process memory (a callable mapping pids to
resident bytes; kvwatch.boundary.proc_inspect.rss provides it). The scrape side only ever reads
:attr:`Watch.snapshot`, a reference to an immutable value: no I/O, no lock.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, cast

from kvwatch.boundary import engine_http
from kvwatch.boundary.engine_http import EngineMetrics, EnginePage
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exporter.actual import (
    ActualKv,
    KvContext,
    replan_reported,
    reported_settings,
)
from kvwatch.exporter.kv_figures import KvFiguresMemo
from kvwatch.exporter.serving import ServingJudge
from kvwatch.exporter.snapshot import ENGINE, HOST, NVML, PROCESS, CollectorResult, EngineSnapshot, WatchSnapshot
from kvwatch.gpu_types import GpuInfo, NvmlSnapshot, parse_cuda_visible_devices
from kvwatch.planner.plan import Plan

_LOG = logging.getLogger(__name__)

ProcessSource = Callable[[Sequence[int]], Mapping[int, int]]
NvmlSource = Callable[[], NvmlSnapshot]
DEFAULT_INTERVAL = 5.0
POKE_GAP = 0.1   # after a poke, changes this close together make one snapshot
_MAX_WARNED = 1024   # distinct warnings remembered (each said once until then)
_T = TypeVar("_T")


@dataclass(frozen=True)
class EngineTarget:
    """One engine to watch."""

    status: EngineStatus                 # what the supervisor knows (plan, pids, counters)
    url: str | None                      # base URL of /health and /metrics; None: not polled
    context: KvContext | None = None     # model and flags: needed for actual (and predicted) KV bytes
    external: bool = False               # not started by kvwatch (`kvwatch export`), see below
    pids_known: bool = True              # False: its pids are unknown, GPU memory cannot be split
    visible_devices: str | None = None   # the engine's CUDA_VISIBLE_DEVICES; None: unset or unknown
    read_by_owner: bool = False          # True: the supervisor reads the engine, `page` is its last read
    page: EnginePage | None = None       # (None: no engine runs); the watch does not read it again

    # An external engine's state is derived: STARTING until /health first answers, READY from
    # then on (nobody restarts it, so a dead one stays READY with engine_up 0, which is what
    # the KvwatchEngineDown alert is for). Its plan is predicted from the figures it reports.


EngineSource = Callable[[], Sequence[EngineTarget]]


@dataclass(frozen=True)
class Source:
    """One source of the watch loop: its name (the `collector` label) and what it reads each tick,
    given the engines to watch: its value and an error (None when it succeeded)."""

    name: str
    read: Callable[[Sequence[EngineTarget]], tuple[Any, str | None]]
    reads_engines: bool = True   # False: read before the engines' statuses are (NVML)


class HostView(Protocol):
    """The engines the other kvwatch instances on this host watch (kvwatch.watchdog.host_registry)."""

    def publish(self, pids: Iterable[int]) -> None: ...
    def others(self) -> frozenset[int]: ...


class Watch:
    def __init__(self, engines: EngineSource, nvml: NvmlSource | None = None,
                 process_source: ProcessSource | None = None, interval: float = DEFAULT_INTERVAL,
                 timeout: float | None = None, clock: Callable[[], float] = time.time,
                 on_snapshot: Callable[[WatchSnapshot], None] | None = None,
                 host: HostView | None = None, all_gpus: bool = False,
                 judge: Callable[[str], ServingJudge] = ServingJudge,
                 poke: threading.Event | None = None) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self._engines = engines
        self._nvml = nvml
        self._process_source = process_source
        self.interval = interval
        self.timeout = timeout if timeout is not None else min(3.0, interval)
        self._clock = clock
        self._on_snapshot = on_snapshot  # called in the watch thread after each swap
        self._host = host                # None: no other kvwatch on this host is known
        self._all_gpus = all_gpus        # export every GPU, not only those of our engines
        self._snapshot = WatchSnapshot.empty()
        self._seen_up: set[str] = set()  # external engines that have answered /health
        self._stop = threading.Event()
        # Set by the owner when what it exports changed (kvwatch run: the supervisor's status): a
        # snapshot is taken at once, not up to an interval later (an engine that died, a stop).
        self._poke = poke if poke is not None else threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._warned: set[str] = set()
        self._judge = judge              # an external engine's stalls and KV pressure (kvwatch run: the supervisor's)
        self._judges: dict[str, ServingJudge] = {}
        self._figures = KvFiguresMemo()   # each engine's KV figures, kept while their inputs are
        # The sources, each only where it was given (the wiring enables a source only where it can
        # work: kvwatch.exporter.sources); each is one `collector` of kvwatch_collector_success.
        candidates = ((NVML, nvml, self._nvml_once, False), (ENGINE, engines, self._poll_engines, True),
                      (PROCESS, process_source, self._processes_once, True), (HOST, host, self._host_once, True))
        self.sources: tuple[Source, ...] = tuple(Source(name, read, reads_engines)
                                                 for name, given, read, reads_engines in candidates if given is not None)

    @property
    def snapshot(self) -> WatchSnapshot:
        """The latest snapshot (reading one reference is atomic; the value never changes)."""
        return self._snapshot

    # -- lifecycle -------------------------------------------------------------

    def start(self, first_tick_inline: bool = True) -> None:
        """Take the first snapshot now (unless told not to), then one per interval in a thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        if first_tick_inline:
            self.tick()
        self._thread = threading.Thread(target=self._run, name="kvwatch-watch", daemon=True,
                                         kwargs={"skip_first": first_tick_inline})
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._poke.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else self.timeout * 3 + 5)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Watch:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, skip_first: bool) -> None:
        next_at = time.monotonic() + (self.interval if skip_first else 0.0)
        while True:
            poked = self._poke.wait(max(0.0, next_at - time.monotonic()))
            if self._stop.is_set():
                return
            if poked:
                self._poke.clear()
                self._stop.wait(POKE_GAP)   # a burst of changes (a restart loop) is one snapshot
                if self._stop.is_set():
                    return
                self._poke.clear()
            try:
                self.tick()
            except Exception:  # one bad tick must not end the loop
                _LOG.exception("watch tick failed")
            if poked:
                continue   # an extra snapshot: the interval's own stay where they were
            next_at += self.interval
            if next_at < time.monotonic():  # a tick overran: skip, do not burst
                next_at = time.monotonic() + self.interval

    # -- one tick --------------------------------------------------------------

    def tick(self) -> WatchSnapshot:
        """Read every source once and publish the new snapshot; returns it."""
        taken_at = self._clock()
        targets: list[EngineTarget] | None = None
        read: dict[str, object] = {}
        collectors: list[CollectorResult] = []
        for source in self.sources:
            if source.reads_engines and targets is None:
                targets = list(self._engines())   # after NVML: every pid NVML shows is in a status by now
            read[source.name], result = _timed(source.name, functools.partial(source.read, targets or []))
            collectors.append(result)
        if targets is None:
            targets = list(self._engines())
        nvml_snapshot = cast("NvmlSnapshot | None", read.get(NVML))
        polled = cast("list[tuple[bool, EngineMetrics | None]] | None", read.get(ENGINE))
        if polled is None:
            polled = [(False, None)] * len(targets)
        rss = cast("Mapping[int, int] | None", read.get(PROCESS))
        other_pids = cast("frozenset[int] | None", read.get(HOST)) or frozenset()
        if nvml_snapshot is not None and nvml_snapshot.available and not self._all_gpus:
            nvml_snapshot = replace(nvml_snapshot, gpus=_gpus_of(targets, nvml_snapshot))

        engines = tuple(self._engine_snapshot(t, up, metrics, rss, nvml_snapshot)
                        for t, (up, metrics) in zip(targets, polled, strict=True))
        snap = WatchSnapshot(taken_at=taken_at, engines=engines, nvml=nvml_snapshot,
                             collectors=tuple(collectors), other_engine_pids=other_pids)
        self._snapshot = snap
        if self._on_snapshot is not None:
            try:
                self._on_snapshot(snap)
            except Exception:  # the snapshot stands; a scrape renders it then
                _LOG.exception("on_snapshot failed")
        return snap

    def _host_once(self, targets: Sequence[EngineTarget]) -> tuple[frozenset[int], str | None]:
        assert self._host is not None
        self._host.publish(sorted({pid for t in targets for pid in t.status.pids}))
        return self._host.others(), None

    def _nvml_once(self, _targets: Sequence[EngineTarget]) -> tuple[NvmlSnapshot, str | None]:
        assert self._nvml is not None
        snap = self._nvml()
        if not snap.available:
            return snap, snap.error or "NVML not available"
        if snap.lost_gpus:
            return snap, "GPU lost: " + ", ".join(str(i) for i in snap.lost_gpus)
        return snap, None

    def _poll_engines(self, targets: Sequence[EngineTarget]) -> tuple[list[tuple[bool, EngineMetrics | None]], str | None]:
        if not targets:
            return [], None
        if len(targets) == 1:   # nothing to overlap: no hand-off to a pool thread and back each tick
            polled = [self._poll_one(targets[0])]
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kvwatch-engine")
            polled = list(self._pool.map(self._poll_one, targets))
        # The collector fails when an engine that answers /health serves no usable /metrics;
        # an engine that is down is kvwatch_engine_up 0, not a collector failure.
        errors = [f"{t.status.name}: {m.error}" for t, (up, m) in zip(targets, polled, strict=True)
                  if up and m is not None and not m.ok]
        return polled, "; ".join(errors) or None

    def _poll_one(self, target: EngineTarget) -> tuple[bool, EngineMetrics | None]:
        if target.read_by_owner:   # kvwatch run: the supervisor's read, one per interval (no I/O here)
            return (target.page.up, target.page.metrics) if target.page is not None else (False, None)
        if target.url is None:
            return False, None
        up = engine_http.health(target.url, self.timeout)
        return up, engine_http.scrape(target.url, self.timeout) if up else None

    def _processes_once(self, targets: Sequence[EngineTarget]) -> tuple[Mapping[int, int], str | None]:
        assert self._process_source is not None
        return dict(self._process_source(sorted({pid for t in targets for pid in t.status.pids}))), None

    def _engine_snapshot(self, target: EngineTarget, up: bool, metrics: EngineMetrics | None,
                         rss: Mapping[int, int] | None, nvml: NvmlSnapshot | None = None) -> EngineSnapshot:
        status = target.status
        if target.external:
            if up:
                self._seen_up.add(status.name)
            state = EngineState.READY if status.name in self._seen_up else EngineState.STARTING
            status = replace(status, state=state)
        cache = metrics.cache if metrics is not None and metrics.ok else None
        planned: Plan | None = status.plan
        actual: ActualKv | None = None
        ranks: dict[str, ActualKv] = {}
        if target.context is not None and cache is not None and metrics is not None:
            try:
                figures = self._figures.figures(status.name, target.context, target.external, metrics,
                                                status.log_kv_tokens, status.log_available_kv_bytes)
                planned = figures.planned if target.external else planned
                ranks = dict(figures.ranks)
            except Exception as exc:  # the planner is pure, but a model it cannot handle must not stop us
                self._warn_once(status.name, f"engine {status.name}: cannot compute its KV figures: {exc!r}")
            actual = ranks.get("0") or next(iter(ranks.values()), None)
            for rank, kv in ranks.items():
                if kv.problems:
                    self._warn_once(f"{status.name}:{rank}:{kv.problems}",
                                    f"engine {status.name} rank {rank}: KV figures disagree: {'; '.join(kv.problems)}")
        if target.external:
            status = self._judged(target, status, metrics, planned, nvml)
        engine_rss = None
        if rss is not None:
            engine_rss = {pid: rss[pid] for pid in status.pids if pid in rss}
        return EngineSnapshot(status=status, up=up, metrics=metrics, planned=planned, actual=actual,
                              actual_ranks=ranks or None, process_rss=engine_rss, pids_known=target.pids_known)

    def _judged(self, target: EngineTarget, status: EngineStatus, metrics: EngineMetrics | None,
                planned: Plan | None, nvml: NvmlSnapshot | None) -> EngineStatus:
        """An external engine's status with its stalls and KV pressure judged on this read."""
        if status.name not in self._judges:
            self._judges[status.name] = self._judge(status.name)
        judge = self._judges[status.name]
        ctx = target.context
        cache = metrics.cache if metrics is not None and metrics.ok else None
        try:
            judge.observe(metrics, planned if ctx is not None and cache is not None else None,
                          reported_settings(ctx, cache) if ctx is not None else None,
                          lambda change: replan_reported(ctx, cache, change) if ctx is not None else None,
                          _free_bytes(nvml) if ctx is not None and ctx.device.platform == "cuda" else None,
                          _compute_seconds(status.pids) if ctx is not None and ctx.device.platform == "cpu" else None)
        except Exception as exc:  # the planner is pure, but a model it cannot handle must not stop us
            self._warn_once(f"{status.name}:judge", f"engine {status.name}: cannot judge its load: {exc!r}")
        return judge.status(status)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            if len(self._warned) >= _MAX_WARNED:   # keys carry an engine's changing figures: stay bounded
                self._warned.clear()
            self._warned.add(key)
            _LOG.warning("%s", message)


def _free_bytes(nvml: NvmlSnapshot | None) -> int | None:
    """The least free memory on the GPUs this instance exports (the engine's): what a higher
    --gpu-memory-utilization could take."""
    if nvml is None or not nvml.available:
        return None
    free = [g.memory_total_bytes - g.memory_used_bytes for g in nvml.gpus
            if g.memory_total_bytes is not None and g.memory_used_bytes is not None]
    return min(free) if free else None


def _compute_seconds(pids: Sequence[int]) -> float | None:
    """The CPU time of the engine's processes but its API server (the root, the process listening):
    progress on vLLM's CPU backend, as under `kvwatch run`."""
    if len(pids) < 2:
        return None
    from kvwatch.boundary import proc_inspect

    return proc_inspect.cpu_seconds(pids[1:])


def _gpus_of(targets: Sequence[EngineTarget], snap: NvmlSnapshot) -> tuple[GpuInfo, ...]:
    """The GPUs this instance exports: those its engines' processes hold memory on (tensor- and
    pipeline-parallel workers included) and those their CUDA_VISIBLE_DEVICES name. Every GPU when
    no engine's processes nor devices are known (nothing to tell them apart by)."""
    if not any(t.pids_known or t.visible_devices for t in targets):
        return snap.gpus
    own = {pid for t in targets for pid in t.status.pids}
    wanted = {g.uuid for g in snap.gpus if any(p.pid in own for p in g.processes or ())}
    uuids: dict[int, str | None] = {i: None for i in snap.lost_gpus}
    uuids.update({g.index: g.uuid for g in snap.gpus})
    by_index = {g.index: g.uuid for g in snap.gpus}
    for t in targets:
        if t.visible_devices is not None:
            wanted.update(by_index[i] for i in parse_cuda_visible_devices(t.visible_devices, uuids) if i in by_index)
    return tuple(g for g in snap.gpus if g.uuid in wanted)


def _timed(name: str, fn: Callable[[], tuple[_T, str | None]]) -> tuple[_T | None, CollectorResult]:
    """Run one collector: its value, and its success and duration (an exception is a failure)."""
    start = time.perf_counter()
    try:
        value, error = fn()
    except Exception as exc:
        value, error = None, f"{type(exc).__name__}: {exc}"
        _LOG.warning("collector %s failed: %s", name, error)
    return value, CollectorResult(name, error is None, time.perf_counter() - start, error)
