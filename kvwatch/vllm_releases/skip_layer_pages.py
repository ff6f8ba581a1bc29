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

MLA models: the platform sizes both pages as a FullAttentionSpec of get_num_kv_heads() heads (1 for
MLA) of get_head_size() (the latent, 576 for DeepSeek-V3), so K and V, twice the latent's page; the
ratio is the dtypes' and the block grows as it would for that spec. The shared page it records is
not read by an MLA layer's spec (MLAAttentionSpec has no padded page). From 0.26 an MLA layer whose
index is named keeps its latent in the model's dtype (a named "sliding_window" is not read there);
0.25 quantizes every MLA layer whatever is named, after growing the block all the same. The MLA
layers' specs then share one block size and one type, so get_kv_cache_groups makes one group of
them all (UniformTypeKVCacheSpecs), its block the sum of their pages. Checked against each release's
spec classes and get_kv_cache_groups (check kv_groups, the MLA skip-layer cases).
"""
from __future__ import annotations

from kvwatch.vllm_releases.kv_layout import Boundary

SKIP_LAYER_PAGE_ALIGNMENT = Boundary((0, 25, 0), "vLLM 0.25.1, vllm/platforms/interface.py:639",
                                     "vLLM 0.24.0, vllm/platforms/interface.py:594")
# where the shared page is recorded and read
SKIP_PAGE_SIZE_PADDED_SET = "vLLM 0.33.0, vllm/platforms/interface.py:933"
SKIP_PAGE_SIZE_PADDED_READ = "vLLM 0.33.0, vllm/model_executor/layers/attention/attention.py:642"

# Where an MLA layer reads the skip list: from 0.26, by its layer index only (mla_attention.py:403-409);
# 0.25 has no such step (its kv_cache_dtype is the cache's, mla_attention.py:389).
MLA_SKIP_LAYERS = Boundary((0, 26, 0), "vLLM 0.26.0, vllm/model_executor/layers/attention/mla_attention.py:403",
                           "vLLM 0.25.1, vllm/model_executor/layers/attention/mla_attention.py:389")
# The platform's page per token for either dtype is FullAttentionSpec(num_kv_heads=get_num_kv_heads(),
# head_size=get_head_size()) for MLA too (vLLM 0.25.1, vllm/platforms/interface.py:675-683), MLA's
# get_num_kv_heads being 1 (vLLM 0.33.0, vllm/config/model.py:1675): kv_groups.platform_skip_pages.
