"""An engine's planned and actual KV figures, computed again only when what they come from changed.

The watch loop reads every engine each tick, but the figures are pure functions of the engine's
context (its model, flags, device and rules: one object per engine), the cache config each rank
reports and the KV figures of its log, which change at a start, not from one tick to the next. Two
plans a tick per engine (0.7 ms) were a tenth of `kvwatch export`'s CPU (bench/bench_overhead.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kvwatch.boundary.engine_http import EngineMetrics
from kvwatch.exporter.actual import ActualKv, KvContext, actual_per_rank, plan_for_reported
from kvwatch.planner.plan import Plan


@dataclass(frozen=True)
class KvFigures:
    planned: Plan | None          # an external engine's plan from its report (None: a supervised one's is its status')
    ranks: dict[str, ActualKv]    # what each data-parallel rank really allocated


class KvFiguresMemo:
    """The last figures of each engine (by name) with what they were computed from."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[KvContext, tuple[object, ...], KvFigures]] = {}

    def figures(self, name: str, ctx: KvContext, external: bool, metrics: EngineMetrics,
                log_kv_tokens: int | None, log_kv_bytes: int | None) -> KvFigures:
        """plan_for_reported (external engines) and actual_per_rank, as the last call when its inputs
        are those of the last call; raises what they raise."""
        inputs = (external, metrics.cache, tuple((r.rank, r.cache) for r in metrics.ranks), log_kv_tokens, log_kv_bytes)
        kept = self._last.get(name)
        if kept is not None and kept[0] is ctx and kept[1] == inputs:
            return kept[2]
        planned = plan_for_reported(ctx, metrics.cache) if external else None
        if planned is not None and len(metrics.ranks) > 1:   # the DP size, as the engine shows it
            planned = replace(planned, data_parallel_size=len(metrics.ranks))
        figures = KvFigures(planned, actual_per_rank(ctx, metrics.ranks, log_kv_tokens, log_kv_bytes))
        self._last[name] = (ctx, inputs, figures)
        return figures
