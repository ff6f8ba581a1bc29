"""The immutable picture the watch loop takes each tick and the collector renders on a scrape."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvwatch.boundary.engine_http import EngineMetrics
from kvwatch.engine_status import EngineStatus
from kvwatch.exporter.actual import ActualKv
from kvwatch.gpu_types import NvmlSnapshot
from kvwatch.planner.plan import Plan

# Collector names, the values of the `collector` label.
NVML = "nvml"        # GPUs and their processes, through NVML
ENGINE = "engine"    # each engine's /health and /metrics
PROCESS = "process"  # the engines' processes (RSS), through the injected process source
HOST = "host"        # the engines other kvwatch instances on this host watch (the shared state dir)


@dataclass(frozen=True)
class CollectorResult:
    name: str
    success: bool
    duration_seconds: float
    error: str | None = None


@dataclass(frozen=True)
class EngineSnapshot:
    status: EngineStatus
    up: bool                                  # /health answered 200 this tick
    metrics: EngineMetrics | None = None      # None: not scraped (no URL, or /health failed)
    planned: Plan | None = None               # the plan in force (or predicted for an external engine)
    actual: ActualKv | None = None            # from the engine's own figures (rank "0")
    actual_ranks: Mapping[str, ActualKv] | None = None   # each data-parallel rank's, by vLLM's `engine` label
    process_rss: Mapping[int, int] | None = None  # pid -> resident bytes; None: not measured
    pids_known: bool = True                   # False: which GPU processes are its is unknown

    @property
    def name(self) -> str:
        return self.status.name

    def actual_by_rank(self) -> Mapping[str, ActualKv]:
        if self.actual_ranks:
            return self.actual_ranks
        return {"0": self.actual} if self.actual is not None else {}

    @property
    def pids(self) -> frozenset[int]:
        return frozenset(self.status.pids)


@dataclass(frozen=True)
class WatchSnapshot:
    taken_at: float                           # time.time() when the tick started
    engines: tuple[EngineSnapshot, ...] = ()
    nvml: NvmlSnapshot | None = None          # None: no NVML collector configured
    collectors: tuple[CollectorResult, ...] = field(default=())
    other_engine_pids: frozenset[int] = frozenset()   # processes of engines other kvwatch instances watch

    @staticmethod
    def empty() -> WatchSnapshot:
        """Before the first tick: no engines, no GPUs, no collector results."""
        return WatchSnapshot(taken_at=0.0)
