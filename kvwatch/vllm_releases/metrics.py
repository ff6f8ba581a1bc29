"""The Prometheus series each vLLM release exports, as kvwatch reads them (pure): the generated
table (generated/metric_names.py) resolved per release, and the KV cache usage series of every release.

vLLM's KV cache usage gauge was vllm:gpu_cache_usage_perc (the V0 engine; V1 beside the new name in
0.10, hidden behind --show-hidden-metrics-for-version in 0.11, gone from 0.12) and is
vllm:kv_cache_usage_perc from V1 on (vLLM 0.10.2, vllm/v1/metrics/loggers.py:244); both are 0..1.
"""
from __future__ import annotations

from kvwatch.vllm_releases.generated.metric_names import BASE, BASE_RELEASE, CHANGES
from kvwatch.vllm_releases.release_chain import expand

_TABLES = expand(BASE_RELEASE, BASE, CHANGES)
KV_USAGE_NEW = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"


def series_of(release: str) -> dict[str, tuple[bool, str]]:
    """The series `release` (a release of the table) registers: name -> (hidden, source)."""
    if release not in _TABLES:
        raise KeyError(f"vLLM {release} is not in the metric table")
    return dict(_TABLES[release])


def kv_usage_names() -> tuple[str, ...]:
    """Every KV cache usage series a release of the table exports, the newer name first: an engine
    exporting both (0.10) is read by the newer."""
    every = set(BASE) | {k for changed, _ in CHANGES.values() for k in changed}
    return tuple(n for n in (KV_USAGE_NEW, KV_USAGE_OLD) if n in every)
