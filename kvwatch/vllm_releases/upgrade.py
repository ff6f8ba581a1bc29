"""An engine whose vLLM release changed since the last launch (an image upgrade), told as the
releases' own data tells it (pure)."""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.errors import KvwatchError
from kvwatch.values.versions import VllmVersion, parse_version
from kvwatch.vllm_releases import resolve
from kvwatch.vllm_releases.defaults_shape import ReleaseDefaults
from kvwatch.vllm_releases.release_defaults import defaults_for


@dataclass(frozen=True)
class ReleaseChange:
    before: str
    after: str
    message: str
    kv_tokens_before: int | None = None    # the last release's measured KV cache
    kv_bytes_before: int | None = None

    def capacity_message(self, kv_tokens: int | None, kv_bytes: int | None) -> str | None:
        """The new release's first measured KV cache against the last release's; None until both
        releases stated the same figure."""
        parts = []
        for unit, old, new in (("KV tokens", self.kv_tokens_before, kv_tokens),
                               ("KV bytes", self.kv_bytes_before, kv_bytes)):
            if old and new is not None:
                parts.append(f"{unit} {old:,} -> {new:,} ({(new - old) / old:+.1%})")
        return f"vLLM {self.before} -> {self.after}: " + ", ".join(parts) if parts else None


def default_changes(a: ReleaseDefaults, b: ReleaseDefaults) -> list[str]:
    """The defaults and budget switches that differ from release a to release b, each with b's source."""
    out = []
    if a.gpu_memory_utilization != b.gpu_memory_utilization:
        out.append(f"default --gpu-memory-utilization {a.gpu_memory_utilization} -> {b.gpu_memory_utilization} "
                   f"({b.cite(b.gpu_memory_utilization_source)})")
    if a.cudagraph_estimate != b.cudagraph_estimate:
        out.append(f"CUDA graph estimate in the KV budget {a.cudagraph_estimate} -> {b.cudagraph_estimate} "
                   f"({b.cite(b.cudagraph_estimate_source) if b.cudagraph_estimate_source else 'absent'})")
    tiers_a = [(t.min_memory_gib, t.exclude_names, t.exclude_capabilities, t.max_num_batched_tokens, t.max_num_seqs)
               for t in a.batch_tiers]
    tiers_b = [(t.min_memory_gib, t.exclude_names, t.exclude_capabilities, t.max_num_batched_tokens, t.max_num_seqs)
               for t in b.batch_tiers]
    if tiers_a != tiers_b:
        out.append(f"batch-default tiers by card ({b.cite(b.batch_tiers[0].source)})")
    if (a.extensible is None) != (b.extensible is None):
        if b.extensible is not None:
            out.append(f"extensible KV cache on by default on CUDA: an unset --gpu-memory-utilization means "
                       f"{b.extensible.utilization} and the cache is sized after warm-up "
                       f"({b.cite(b.extensible.source)}); an explicit utilization below it caps the cache")
        else:
            out.append(f"extensible KV cache gone: the profile's estimate sizes the cache ({b.cite(b.gpu_memory_utilization_source)})")
    if a.block_size != b.block_size:
        out.append(f"default block size {a.block_size} -> {b.block_size} ({b.cite(b.block_size_source)})")
    if bool(a.startup_plan_schema) != bool(b.startup_plan_schema):
        out.append(f"persisted start-up plan {'available' if b.startup_plan_schema else 'gone'}"
                   + (f" ({b.cite(b.startup_plan_source)})" if b.startup_plan_source else ""))
    return out


def _version(text: str | None) -> VllmVersion | None:
    try:
        return parse_version(text) if text else None
    except KvwatchError:
        return None


def release_change(recorded: str | None, current: str | None, last_kv_tokens: int | None,
                   last_kv_bytes: int | None) -> ReleaseChange | None:
    """What to say when the engine's release differs from the one recorded at the last launch;
    None when it does not, or either is unknown. The last release's measured KV cache is the
    baseline the new release's first launch is compared against."""
    before, after = _version(recorded), _version(current)
    if before is None or after is None or before.parts == after.parts:
        return None
    changes = default_changes(defaults_for(before), defaults_for(after))
    measured = ""
    if last_kv_tokens is not None or last_kv_bytes is not None:
        figures = [f"{last_kv_tokens:,} KV tokens" if last_kv_tokens is not None else "",
                   f"{last_kv_bytes / 2**30:.2f} GiB of KV cache" if last_kv_bytes is not None else ""]
        measured = f"; under {before} the engine measured {', '.join(f for f in figures if f)}"
    what = "; ".join(changes) if changes else "no default or budget switch kvwatch tracks changed"
    return ReleaseChange(str(before), str(after),
                         f"vLLM release changed {before} -> {after} since the last launch{measured}; "
                         f"{what}; figures learned under {before} are not reused (the memory is profiled again)",
                         last_kv_tokens, last_kv_bytes)


def planned_as(release: str | None) -> str | None:
    """The known release whose facts kvwatch plans `release` with; None when unknown or unreadable."""
    version = _version(release)
    return str(resolve(version).used) if version is not None else None
