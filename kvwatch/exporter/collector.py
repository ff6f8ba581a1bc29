"""The Prometheus collector: every scrape builds fresh metric families from the latest snapshot.

Shaped after client_python's ProcessCollector: one ``collect()``, families built afresh,
the source injected. No I/O and no lock: the snapshot is an immutable value read through
one reference, so a GPU, engine or process that is gone simply has no series. Values a
source did not report are left out, never NaN. Every metric is in docs/reference.md's table.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvwatch import __version__
from kvwatch.diagnosis.startup_lines import MEMORY_PARTS
from kvwatch.engine_status import EngineState
from kvwatch.exporter.snapshot import EngineSnapshot, WatchSnapshot
from kvwatch.failure_kinds import FailureKind
from kvwatch.gpu_types import GpuInfo
from kvwatch.watchdog.gpu_release import ReleaseOutcome

# The diagnosis' failure classes: the known values of the `reason` and `kind` labels,
# exported at 0 from the start so that increase() sees the first one.
FAILURE_KINDS = tuple(kind.value for kind in FailureKind)
ENGINE_STATES = tuple(state.value for state in EngineState)
AUTOPILOT_RESULTS = ("applied", "kept", "rolled_back")   # kvwatch_autopilot_changes_total's `result`
# kvwatch_gpu_release_waits_total's `outcome`: every end of the wait (never "wait", its state meanwhile)
GPU_RELEASE_OUTCOMES = tuple(o.value for o in ReleaseOutcome if o is not ReleaseOutcome.WAIT)

_E = ("engine",)
_R = ("engine", "rank")   # rank: the data-parallel engine core (vLLM's `engine` label), "0" without DP
GAUGE, COUNTER = "gauge", "counter"


@dataclass(frozen=True)
class Family:
    """One metric family: the key its renderer adds samples under, its name (a counter's without
    `_total`), its type, its labels and its HELP. FAMILIES is the one table of them."""

    key: str
    name: str
    type: str                 # GAUGE or COUNTER
    labels: tuple[str, ...]
    help: str


FAMILIES = (
    Family("build_info", "kvwatch_build_info", GAUGE, ("version",),
           "kvwatch's version, always 1."),
    Family("up", "kvwatch_engine_up", GAUGE, _E,
           "1 when the engine answered /health at the last snapshot, else 0."),
    Family("state", "kvwatch_engine_state", GAUGE, (*_E, "state"),
           "1 for the engine's current state, 0 for the others (starting, ready, backoff, stopping, stopped,"
           " fatal)."),
    Family("restarts", "kvwatch_engine_restarts", COUNTER, (*_E, "reason"),
           "Relaunches of the engine by kvwatch, by the failure class that caused them."),
    Family("failures", "kvwatch_engine_failures", COUNTER, (*_E, "kind"),
           "Failures of the engine kvwatch has seen, by diagnosed class."),
    Family("corrections", "kvwatch_plan_corrections", COUNTER, (*_E, "kind"),
           "Corrected plans kvwatch applied, by the failure class they answer."),
    Family("log_dropped", "kvwatch_engine_log_lines_dropped", COUNTER, _E,
           "Lines of the engine's output that kvwatch's own stdout did not take in time (its reader stopped "
           "reading): dropped so that the engine never waits."),
    Family("escaped", "kvwatch_engine_escaped_processes", GAUGE, _E,
           "Processes that call themselves vLLM's, run as the engine's user and are claimed by no other kvwatch, "
           "but that kvwatch could not prove the engine's at its last stop or clean-up (never signalled; see "
           "the log's 'escaped:' lines)."),
    Family("plan_info", "kvwatch_plan_info", GAUGE, (*_E, "block_size", "kv_cache_dtype", "backend", "attention", "source"),
           "The KV cache plan in force, always 1; source: how its KV memory is known (exact: a flag or the "
           "environment fixes it; learned: from the engine's own profile on an earlier launch; estimated: "
           "from config.json and the card)."),
    Family("planned_bytes", "kvwatch_kv_planned_bytes", GAUGE, _R,
           "KV cache bytes the plan predicts: planned blocks x the planner's bytes per block."),
    Family("actual_bytes", "kvwatch_kv_actual_bytes", GAUGE, _R,
           "KV cache bytes the engine allocated: its num_gpu_blocks (vllm:cache_config_info) x the planner's"
           " bytes per block for the block size and KV dtype the engine reports; cross-checked (logged) "
           "against the KV tokens of its startup log and its KV memory."),
    Family("planned_blocks", "kvwatch_kv_planned_blocks", GAUGE, _R,
           "KV cache blocks the plan predicts (the null block included)."),
    Family("actual_blocks", "kvwatch_kv_actual_blocks", GAUGE, _R,
           "KV cache blocks the engine reports: num_gpu_blocks of vllm:cache_config_info (the null block "
           "included)."),
    Family("padding_bytes", "kvwatch_kv_padding_bytes", GAUGE, (*_R, "cause"),
           "KV bytes the plan predicts are padding, by cause: the remainder of the KV memory below one "
           "block, the null block, packed layouts, a hybrid's empty layer slots (layer_padding) and "
           "recurrent states padded to the attention page (state_padding)."),
    Family("padding_ratio", "kvwatch_kv_padding_ratio", GAUGE, _R,
           "Padding over allocated KV bytes from the engine's figures: the remainder of the KV memory it "
           "reports below one block, its null block, and the layout padding of the block size and KV dtype "
           "it reports."),
    Family("planned_padding_ratio", "kvwatch_kv_planned_padding_ratio", GAUGE, _R,
           "Padding over allocated KV bytes as the plan predicts it."),
    Family("drift", "kvwatch_kv_plan_drift_ratio", GAUGE, _R,
           "(actual - planned) / planned KV cache bytes, for a plan whose KV memory is exact or learned "
           "(kvwatch_plan_info's source)."),
    Family("estimate_error", "kvwatch_kv_plan_estimate_error_ratio", GAUGE, _R,
           "(actual - planned) / planned KV cache bytes, for an estimated plan (kvwatch_plan_info's source):"
           " the estimate's error, for capacity planning, never alerted on."),
    Family("usage", "kvwatch_kv_usage_ratio", GAUGE, _R,
           "The engine's own vllm:kv_cache_usage_perc (0..1)."),
    Family("memory", "kvwatch_engine_memory_bytes", GAUGE, (*_E, "part"),
           "One GPU's memory of the engine by part, as the engine's start-up lines state it (weights, "
           "activation_peak, non_torch, cuda_graphs, kv_cache; only the parts it stated: V1 engines state "
           "weights, kv_cache and cuda_graphs)."),
    Family("memory_requested", "kvwatch_engine_memory_requested_bytes", GAUGE, _E,
           "The GPU memory the engine may use: the CUDA total x the utilization it takes (the flag, else its"
           " release's default): the budget vLLM sizes its KV cache against; CUDA GPUs only."),
    Family("release_info", "kvwatch_engine_release_info", GAUGE, (*_E, "version", "planned_as"),
           "The engine's vLLM release (version) and the release whose facts kvwatch plans it with (planned_as: "
           "the nearest kvwatch has read), always 1."),
    Family("recommendation", "kvwatch_recommendation_info", GAUGE, (*_E, "change", "reason"),
           "1 while kvwatch recommends this one flag change for KV pressure (preemptions, or a full cache with "
           "requests waiting), reason saying why; chosen by the planner, legal for the GPU, backend and release."),
    Family("recommendation_tokens", "kvwatch_recommendation_kv_tokens", GAUGE, (*_E, "plan"),
           "KV tokens per rank of the plan in force (plan=current) and with the recommended change "
           "(plan=recommended), as the planner computes them."),
    Family("recommendation_concurrency", "kvwatch_recommendation_concurrency", GAUGE, (*_E, "plan"),
           "Requests of max-model-len the KV cache holds, in the plan in force and with the recommended change."),
    Family("autopilot", "kvwatch_autopilot_changes", COUNTER, (*_E, "result"),
           "KV-pressure changes the autopilot ([autopilot] apply) made by itself, this kvwatch run: result=applied "
           "(put on trial), kept (measured better), rolled_back (measured worse, or the engine failed on trial)."),
    Family("release_changes", "kvwatch_engine_release_changes", COUNTER, _E,
           "Times the engine's vLLM release differed from the one recorded in the state file at the last launch "
           "(an image upgrade), seen by this kvwatch."),
    Family("gpu_release_waits", "kvwatch_gpu_release_waits", COUNTER, (*_E, "outcome"),
           "Waits before a relaunch until the dead engine's GPU memory was released on every GPU it held (its "
           "pids gone from NVML, used memory back to its level before the launch), by outcome: released, "
           "timed_out (relaunched onto GPUs still held), unavailable (NVML could not tell), cancelled (kvwatch "
           "stopping)."),
    Family("gpu_release_wait", "kvwatch_gpu_release_wait_seconds", GAUGE, _E,
           "How long the last wait for the dead engine's GPU memory took."),
    Family("gpu_info", "kvwatch_gpu_info", GAUGE, ("gpu", "index", "name"),
           "One per GPU seen by NVML, always 1."),
    Family("gpu_total", "kvwatch_gpu_memory_total_bytes", GAUGE, ("gpu",),
           "Total GPU memory (NVML)."),
    Family("gpu_used", "kvwatch_gpu_memory_used_bytes", GAUGE, ("gpu",),
           "Used GPU memory (NVML; without the driver's reservation where the driver reports it apart)."),
    Family("engine_gpu", "kvwatch_engine_gpu_memory_bytes", GAUGE, (*_R, "gpu"),
           "GPU memory NVML attributes to the engine's process tree, by data-parallel rank (the rank's "
           "engine core and its workers; empty for the engine's processes under no core, such as the API "
           "server)."),
    Family("engine_rss", "kvwatch_engine_process_resident_bytes", GAUGE, _R,
           "Resident memory (RSS) of the engine's processes, by data-parallel rank (as "
           "kvwatch_engine_gpu_memory_bytes; empty for processes under no core)."),
    Family("foreign", "kvwatch_gpu_foreign_memory_bytes", GAUGE, ("gpu",),
           "GPU memory held by processes that are in no supervised engine's process tree."),
    Family("success", "kvwatch_collector_success", GAUGE, ("collector",),
           "1 when the collector's last snapshot succeeded, else 0."),
    Family("duration", "kvwatch_collector_duration_seconds", GAUGE, ("collector",),
           "Time the collector's last snapshot took."),
)
HELP = {family.name: family.help for family in FAMILIES}


def _family(family: Family) -> Metric:
    make = GaugeMetricFamily if family.type == GAUGE else CounterMetricFamily
    return make(family.name, family.help, labels=list(family.labels))


class KvwatchCollector(Collector):
    """Renders ``snapshot()``: pass ``Watch``'s bound property getter, or a fixed value in tests."""

    def __init__(self, snapshot: Callable[[], WatchSnapshot], version: str = __version__) -> None:
        self._snapshot = snapshot
        self._version = version

    def describe(self) -> Iterable[Metric]:
        """The family names, without samples: registering never renders a snapshot."""
        return list(self._families(WatchSnapshot.empty()).values())

    def collect(self) -> Iterator[Metric]:
        yield from (family for family in self._families(self._snapshot()).values() if family.samples)

    def _families(self, snap: WatchSnapshot) -> dict[str, Metric]:
        f: dict[str, Any] = {family.key: _family(family) for family in FAMILIES}
        f["build_info"].add_metric([self._version], 1)
        for engine in sorted(snap.engines, key=lambda e: e.name):
            _engine(f, engine)
        if snap.nvml is not None:
            _gpus(f, snap)
        for result in sorted(snap.collectors, key=lambda r: r.name):
            f["success"].add_metric([result.name], 1 if result.success else 0)
            f["duration"].add_metric([result.name], result.duration_seconds)
        return f


def _counts(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    merged = {kind: 0 for kind in FAILURE_KINDS}
    merged.update(counts)
    return sorted(merged.items())


def _engine(f: dict[str, Any], engine: EngineSnapshot) -> None:
    name, status = engine.name, engine.status
    f["up"].add_metric([name], 1 if engine.up else 0)
    for state in ENGINE_STATES:
        f["state"].add_metric([name, state], 1 if status.state.value == state else 0)
    for key, family in (("restarts", status.restarts), ("failures", status.failures),
                        ("corrections", status.corrections)):
        for label, value in _counts(family):
            f[key].add_metric([name, label], value)
    f["log_dropped"].add_metric([name], status.log_lines_dropped)
    f["escaped"].add_metric([name], status.escaped_processes)

    plan = engine.planned
    actual_ranks = engine.actual_by_rank()
    metrics = engine.metrics if engine.metrics is not None and engine.metrics.ok else None
    # Every DP rank sizes its cache alone, so the plan is each rank's; ranks as the engine
    # reports them, else as the plan's DP size says (bounded by it).
    reported = set(actual_ranks) | ({r.rank for r in metrics.ranks} if metrics else set())
    ranks = sorted(reported, key=lambda r: (len(r), r))
    if not ranks and plan is not None:
        ranks = [str(i) for i in range(plan.data_parallel_size)]
    if plan is not None:
        f["plan_info"].add_metric([name, str(plan.block_size), plan.kv_cache_dtype, plan.backend or "none",
                                   plan.attention, plan.source], 1)
        for rank in ranks:
            f["planned_bytes"].add_metric([name, rank], plan.planned_kv_bytes)
            f["planned_blocks"].add_metric([name, rank], plan.num_blocks)
            for cause, value in sorted(plan.padding_bytes.items()):
                f["padding_bytes"].add_metric([name, rank, cause], value)
            f["planned_padding_ratio"].add_metric([name, rank], plan.padding_ratio)
    # An estimate's miss (or a plan with layers kvwatch could not classify) is not a change in the
    # engine: only exact and learned plans drift.
    difference = "estimate_error" if plan is not None and plan.source in ("estimated", "unknown") else "drift"
    for rank, actual in sorted(actual_ranks.items(), key=lambda kv: (len(kv[0]), kv[0])):
        f["actual_bytes"].add_metric([name, rank], actual.kv_bytes)
        f["actual_blocks"].add_metric([name, rank], actual.blocks)
        f["padding_ratio"].add_metric([name, rank], actual.padding_ratio)
        if plan is not None and plan.planned_kv_bytes > 0:
            f[difference].add_metric([name, rank], (actual.kv_bytes - plan.planned_kv_bytes) / plan.planned_kv_bytes)
    for part in MEMORY_PARTS:   # the parts the engine stated, from the status: no I/O here
        if (part_bytes := status.log_memory_parts.get(part)) is not None:
            f["memory"].add_metric([name, part], part_bytes)
    if status.memory_requested_bytes is not None:
        f["memory_requested"].add_metric([name], status.memory_requested_bytes)
    if (found := status.recommendation) is not None:
        f["recommendation"].add_metric([name, found.change.describe(), found.reason], 1)
        f["recommendation_tokens"].add_metric([name, "current"], found.tokens_before)
        f["recommendation_tokens"].add_metric([name, "recommended"], found.tokens_after)
        for which, concurrency in (("current", found.concurrency_before), ("recommended", found.concurrency_after)):
            if concurrency is not None:
                f["recommendation_concurrency"].add_metric([name, which], concurrency)
    if status.vllm_release is not None:   # a supervised engine (kvwatch export knows no release)
        f["release_info"].add_metric([name, status.vllm_release, status.vllm_release_planned_as or ""], 1)
        f["release_changes"].add_metric([name], status.release_changes)
        for result in AUTOPILOT_RESULTS:   # at 0 from the start, as the restarts: increase() sees the first
            f["autopilot"].add_metric([name, result], status.autopilot.get(result, 0))
        for outcome in GPU_RELEASE_OUTCOMES:
            f["gpu_release_waits"].add_metric([name, outcome], status.gpu_release_waits.get(outcome, 0))
    if status.gpu_release_wait_seconds is not None:
        f["gpu_release_wait"].add_metric([name], status.gpu_release_wait_seconds)
    if engine.process_rss:
        for rank, rss in sorted(_by_rank(engine.process_rss.items(), status.pid_ranks).items()):
            f["engine_rss"].add_metric([name, rank], rss)
    if metrics is not None:
        usage = [(r.rank, r.kv_cache_usage_ratio) for r in metrics.ranks if r.kv_cache_usage_ratio is not None]
        if not usage and metrics.kv_cache_usage_ratio is not None:
            usage = [("0", metrics.kv_cache_usage_ratio)]
        for rank, ratio in usage:
            f["usage"].add_metric([name, rank], ratio)


def _by_rank(pid_bytes: Iterable[tuple[int, int]], pid_ranks: Mapping[int, int]) -> dict[str, int]:
    """Bytes summed by the data-parallel rank of each pid: without data parallelism every process
    is rank 0's; with it, a process under no engine core (the API server) is rank ""."""
    out: dict[str, int] = {}
    for pid, value in pid_bytes:
        rank = str(pid_ranks[pid]) if pid in pid_ranks else ("" if pid_ranks else "0")
        out[rank] = out.get(rank, 0) + value
    return out


def _gpus(f: dict[str, Any], snap: WatchSnapshot) -> None:
    assert snap.nvml is not None
    owners = [(e.name, e.pids, e.status.pid_ranks) for e in sorted(snap.engines, key=lambda e: e.name)]
    all_known = all(e.pids_known for e in snap.engines)
    # Foreign: held by no engine that any kvwatch on this host watches.
    engine_pids = frozenset().union(*(pids for _, pids, _ in owners)) | snap.other_engine_pids
    for gpu in sorted(snap.nvml.gpus, key=lambda g: g.index):
        _gpu(f, gpu)
        if gpu.processes is None:  # NVML does not say who holds memory on this GPU
            continue
        for name, pids, pid_ranks in owners:
            held = _by_rank(((p.pid, p.used_bytes) for p in gpu.processes
                             if p.pid in pids and p.used_bytes is not None), pid_ranks)
            for rank, used in sorted(held.items()):
                f["engine_gpu"].add_metric([name, rank, gpu.uuid], used)
        if all_known:
            foreign = sum(p.used_bytes for p in gpu.processes
                          if p.pid not in engine_pids and p.used_bytes is not None)
            f["foreign"].add_metric([gpu.uuid], foreign)


def _gpu(f: dict[str, Any], gpu: GpuInfo) -> None:
    f["gpu_info"].add_metric([gpu.uuid, str(gpu.index), gpu.name or ""], 1)
    if gpu.memory_total_bytes is not None:
        f["gpu_total"].add_metric([gpu.uuid], gpu.memory_total_bytes)
    if gpu.memory_used_bytes is not None:
        f["gpu_used"].add_metric([gpu.uuid], gpu.memory_used_bytes)
