"""The page of layers kept out of KV cache quantization, per vLLM release (pure data).

`--kv-cache-dtype-skip-layers` (layer indices, or `sliding_window`) keeps those layers' KV cache in the
model's dtype beside a quantized primary (`--kv-cache-dtype fp8`, ...). From 0.25 the platform
aligns the two before the specs are built (`Platform._align_heterogeneous_kv_block_size`): where a
skip layer's page per token is wider than the primary's, the primary block size grows, in multiples
of max(the backend's smallest kernel block, the block size in force), until the primary page covers
the skip page at the smallest kernel block (and a Mamba page already padded); that primary page is
then `CacheConfig.skip_page_size_padded`, the page a sliding-window skip layer pads up to (it takes
the largest kernel block fitting it), and a padded Mamba page follows it. Before 0.25 nothing is
aligned: page unification scales or pads the specs as they come. Checked against each release's own
function by scripts/check_release_functions.py (check skip_layer_block_size).
"""
from __future__ import annotations

from kvwatch.vllm_releases.kv_layout import Boundary

SKIP_LAYER_PAGE_ALIGNMENT = Boundary((0, 25, 0), "vLLM 0.25.1, vllm/platforms/interface.py:639",
                                     "vLLM 0.24.0, vllm/platforms/interface.py:594")
# where the shared page is recorded and read
SKIP_PAGE_SIZE_PADDED_SET = "vLLM 0.33.0, vllm/platforms/interface.py:933"
SKIP_PAGE_SIZE_PADDED_READ = "vLLM 0.33.0, vllm/model_executor/layers/attention/attention.py:642"
