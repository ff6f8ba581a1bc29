"""The lookups the planner makes in vLLM's defaults per release (pure).

The data is generated into defaults.py from each release's own source (scripts/gen_release_defaults.py),
in the types of defaults_shape.py; this module is the one place that reads it, so no default of vLLM is
written twice in kvwatch.
"""
from __future__ import annotations

from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import resolve
from kvwatch.vllm_releases.defaults import DEFAULTS
from kvwatch.vllm_releases.defaults_shape import ReleaseDefaults


def defaults_for(version: VllmVersion) -> ReleaseDefaults:
    """The defaults of the known release `version` is planned as (vllm_releases.resolve)."""
    return DEFAULTS[str(resolve(version).used)]


def api_batch_defaults(defaults: ReleaseDefaults, platform: str, total_memory_bytes: int, name: str,
                       capability: tuple[int, int] | None, world_size: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's get_batch_defaults gives the API server."""
    if platform == "cpu":
        world = max(1, world_size)
        return defaults.cpu_tokens_per_rank * world, defaults.cpu_seqs_per_rank * world
    tier = defaults.gpu_batch_tier(total_memory_bytes, name, capability)
    return tier.max_num_batched_tokens, tier.max_num_seqs
