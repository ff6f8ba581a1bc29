"""The upgrade check: one engine command planned for two vLLM releases, each difference with its
reason and the source line of the release that makes it (pure).

The reasons come from the releases' own data (vllm_releases/defaults.py): a changed default
utilization, a CUDA graph estimate now taken from the budget, another batch tier for the card, another
default block size. A figure that only follows from those (blocks, tokens, the KV share) says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvwatch.planner.devices import Device
from kvwatch.planner.plan import Plan
from kvwatch.planner.units import format_bytes
from kvwatch.planner.versions import VllmVersion
from kvwatch.vllm_releases import resolve
from kvwatch.vllm_releases.release_defaults import ReleaseDefaults, defaults_for


@dataclass(frozen=True)
class Difference:
    field: str
    a: Any
    b: Any
    reason: str
    source: str            # "vLLM X.Y.Z, file:line" of what makes it, "" when it only follows

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "a": self.a, "b": self.b, "reason": self.reason, "source": self.source}


@dataclass(frozen=True)
class ReleaseComparison:
    version_a: str
    version_b: str
    used_a: str            # the known release each is planned as
    used_b: str
    notes: tuple[str, ...]  # why a release is planned as another
    differences: tuple[Difference, ...]

    def to_json(self) -> dict[str, Any]:
        return {"a": {"version": self.version_a, "planned_as": self.used_a},
                "b": {"version": self.version_b, "planned_as": self.used_b},
                "notes": list(self.notes), "differences": [d.to_json() for d in self.differences]}


def _tier_source(d: ReleaseDefaults, device: Device) -> str:
    if device.platform == "cpu":
        return d.cite(d.cpu_source)
    tier = d.gpu_batch_tier(device.total_memory_bytes or 0, device.name, device.compute_capability)
    return d.cite(tier.source)


def _cause_rows(a: Plan, b: Plan, da: ReleaseDefaults, db: ReleaseDefaults, device: Device) -> list[Difference]:
    """What the releases themselves change, each with the newer-side source line."""
    out: list[Difference] = []
    ga, gb = a.gpu_budget, b.gpu_budget
    if ga is not None and gb is not None:
        if ga.utilization != gb.utilization:
            given = da.gpu_memory_utilization != db.gpu_memory_utilization
            out.append(Difference("utilization", ga.utilization, gb.utilization,
                                  "the default --gpu-memory-utilization" if given else "the utilization",
                                  f"{da.cite(da.gpu_memory_utilization_source)}; "
                                  f"{db.cite(db.gpu_memory_utilization_source)}"))
        if ga.cuda_graph_bytes != gb.cuda_graph_bytes:
            side = db if gb.cuda_graph_bytes else da
            out.append(Difference("cuda_graphs", ga.cuda_graph_bytes, gb.cuda_graph_bytes,
                                  f"CUDA graph estimate taken from the KV budget in vLLM {side.release} "
                                  f"(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS {side.cudagraph_estimate})",
                                  f"{side.cite(side.cudagraph_estimate_source)}; {side.cite(side.cudagraph_applied_source)}"))
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            va, vb = getattr(ga, name), getattr(gb, name)
            if va != vb:
                out.append(Difference(name, va, vb, f"the scheduler's default for {device.name}",
                                      f"{_tier_source(da, device)}; {_tier_source(db, device)}"))
        if ga.activation_peak_bytes != gb.activation_peak_bytes:
            why = "the profile run's batch" if (ga.max_num_batched_tokens, ga.max_num_seqs) != (
                gb.max_num_batched_tokens, gb.max_num_seqs) else f"the sampler: {gb.release.split(';')[0]}"
            out.append(Difference("activation_peak", ga.activation_peak_bytes, gb.activation_peak_bytes,
                                  f"follows from {why}", ""))
        for name in ("weights_bytes", "non_torch_bytes"):
            va, vb = getattr(ga, name), getattr(gb, name)
            if va != vb:
                out.append(Difference(name.removesuffix("_bytes"), va, vb, "the memory profile's estimate", ""))
    if a.block_size != b.block_size:
        source = f"{da.cite(da.block_size_source)}; {db.cite(db.block_size_source)}" \
            if da.block_size != db.block_size else ""
        out.append(Difference("block_size", a.block_size, b.block_size,
                              f"{a.block_size_source} -> {b.block_size_source}", source))
    if a.backend != b.backend:
        out.append(Difference("backend", a.backend, b.backend, "the release's backend priorities", ""))
    return out


def _result_rows(a: Plan, b: Plan, causes: list[Difference]) -> list[Difference]:
    """What follows: the KV share, blocks, tokens, max model len, concurrency."""
    named = ", ".join(c.field for c in causes) or "the plan"
    pairs = [("kv_memory_bytes", a.kv_memory_bytes, b.kv_memory_bytes),
             ("num_blocks", a.num_blocks, b.num_blocks),
             ("kv_cache_tokens", a.kv_cache_tokens, b.kv_cache_tokens),
             ("max_model_len", a.max_model_len, b.max_model_len),
             ("max_concurrency", round(a.max_concurrency or 0.0, 2), round(b.max_concurrency or 0.0, 2))]
    return [Difference(name, va, vb, f"follows from {named}", "") for name, va, vb in pairs if va != vb]


def _refusal_rows(a: Plan, b: Plan) -> list[Difference]:
    wa = {(w.kind.value, w.message) for w in a.warnings}
    wb = {(w.kind.value, w.message) for w in b.warnings}
    out = [Difference(f"refusal {kind}", "yes", None, message, "") for kind, message in sorted(wa - wb)]
    out += [Difference(f"refusal {kind}", None, "yes", message, "") for kind, message in sorted(wb - wa)]
    return out


def compare_releases(a: Plan, b: Plan, version_a: VllmVersion, version_b: VllmVersion,
                     device: Device) -> ReleaseComparison:
    choice_a, choice_b = resolve(version_a), resolve(version_b)
    da, db = defaults_for(version_a), defaults_for(version_b)
    causes = _cause_rows(a, b, da, db, device)
    return ReleaseComparison(
        str(version_a), str(version_b), str(choice_a.used), str(choice_b.used),
        tuple(c.why for c in (choice_a, choice_b) if c.why),
        tuple(causes + _result_rows(a, b, causes) + _refusal_rows(a, b)))


_BYTE_FIELDS = {"cuda_graphs", "activation_peak", "weights", "non_torch", "kv_memory_bytes"}


def _cell(field: str, value: Any) -> str:
    if value is None:
        return "-"
    if field in _BYTE_FIELDS and isinstance(value, int):
        return format_bytes(value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_comparison(c: ReleaseComparison) -> str:
    head = f"vLLM {c.version_a} -> {c.version_b}"
    lines = [head, *(f"note: {n}" for n in c.notes)]
    if not c.differences:
        return "\n".join([*lines, "no difference: the two releases plan this command alike"])
    width = max(len(d.field) for d in c.differences)
    cells = [(_cell(d.field, d.a), _cell(d.field, d.b)) for d in c.differences]
    wa = max(len(x) for x, _ in cells)
    wb = max(len(y) for _, y in cells)
    for d, (x, y) in zip(c.differences, cells, strict=True):
        lines.append(f"{d.field:<{width}}  {x:>{wa}} -> {y:<{wb}}  {d.reason}")
        if d.source:
            lines.append(f"{'':<{width}}  {'':>{wa}}    {'':<{wb}}  source: {d.source}")
    return "\n".join(lines)
