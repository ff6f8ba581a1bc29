"""The "GPU KV cache size: N tokens" line each vLLM release logs, as it computes it (pure).

Checked by scripts/check_release_functions.py (check kv_tokens): each release's own reporting
function run on its own KV cache groups and a KVCacheConfig of its own class.
"""
from __future__ import annotations

from kvwatch.values.versions import VllmVersion

# Before 0.20 the blocks are shared out over the KV cache groups at the smallest group block size
# (vLLM 0.11.2, vllm/v1/core/kv_cache_utils.py:1217 `num_blocks // len(kv_cache_groups) *
# min_block_size`, to vLLM 0.19.1, kv_cache_utils.py:1302; 0.10.2 likewise for several groups,
# kv_cache_utils.py:1026). From 0.20 it is the maximum concurrency x max_model_len (vLLM 0.20.2,
# vllm/v1/core/kv_cache_utils.py:1706 `int(max_concurrency * max_model_len)`; 0.28+
# get_kv_cache_capacity, vLLM 0.28.0, kv_cache_utils.py:1855), so a sliding window or a recurrent
# state counts what one request really holds.
CONCURRENCY_TOKENS_SINCE = (0, 20, 0)
CONCURRENCY_TOKENS_SOURCE = "vLLM 0.20.2, vllm/v1/core/kv_cache_utils.py:1706"


def reported_kv_tokens(concurrency_tokens: int, num_blocks: int, groups: int, min_block_size: int,
                       version: VllmVersion | None) -> int:
    """The token count release `version` logs (None: the newest), given int(max concurrency x
    max_model_len), the blocks, the number of KV cache groups and their smallest block size."""
    if version is None or version.parts >= CONCURRENCY_TOKENS_SINCE or not num_blocks:
        return concurrency_tokens
    return num_blocks // max(1, groups) * min_block_size
