"""Layers kept out of KV cache quantization (--kv-cache-dtype-skip-layers), as tables: the platform's
alignment of the primary block to the skip layers' page (vllm_releases/skip_layer_pages.py, 0.25+).

vLLM's own function answers the same kind of inputs in tests/test_release_oracles.py
(check skip_layer_block_size).
"""
from __future__ import annotations

import pytest

from kvwatch.planner.kv_groups import skip_layer_block_size
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.skip_layer_pages import SKIP_LAYER_PAGE_ALIGNMENT


@pytest.mark.parametrize("backend,block,primary,skip,mamba,expected", [
    # fp8 beside bf16 (8 KV heads of 128): the primary page must cover 16 skip tokens: 32 tokens
    ("FLASH_ATTN", 16, 2_048, 4_096, None, (32, 65_536, None)),
    ("FLASH_ATTN", 64, 2_048, 4_096, None, (64, 131_072, None)),      # already covers it: kept
    # a primary page that does not divide the skip page: 16 x ceil(65,536 / (16 x 1,152)) = 64
    ("FLASH_ATTN", 16, 1_152, 4_096, None, (64, 73_728, None)),
    # a Mamba page the hybrid alignment padded: the primary page covers it too, and it follows
    ("FLASH_ATTN", 16, 2_048, 4_096, 1_179_648, (576, 1_179_648, 1_179_648)),
    ("FLASH_ATTN", 16, 4_096, 4_096, None, (16, None, None)),         # same page per token: nothing to align
    ("CPU_ATTN", 128, 2_048, 4_096, None, (128, 262_144, None)),
])
def test_the_primary_block_grows_until_its_page_covers_the_skip_page(backend, block, primary, skip, mamba,
                                                                     expected) -> None:
    rule = ruleset_for("0.33.0").backend(backend)
    assert rule is not None
    assert skip_layer_block_size(rule, block, primary, skip, mamba) == expected


@pytest.mark.parametrize("release,aligns", [("0.24.0", False), ("0.25.1", True), ("0.33.0", True)])
def test_releases_align_skip_layer_pages_from_025(release: str, aligns: bool) -> None:
    assert SKIP_LAYER_PAGE_ALIGNMENT.holds(parse_version(release)) is aligns


LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336,
            "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
GEMMA3 = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 12,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "hidden_size": 1152,
          "intermediate_size": 6912, "vocab_size": 262144, "sliding_window": 512, "max_position_embeddings": 32768,
          "torch_dtype": "bfloat16"}


def _plan(cfg: dict, release: str, *flags: str):
    from kvwatch.planner.devices import preset
    from kvwatch.planner.engine_args import EngineCommand
    from kvwatch.planner.geometry import geometry_from_config
    from kvwatch.planner.plan import MemoryInputs, make_plan
    settings = EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-dtype", "fp8", *flags], release).settings()
    return make_plan(geometry_from_config(cfg, release), settings, preset("h100"), ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release)))


def test_a_skip_layer_keeps_the_models_dtype_and_grows_the_block_from_025() -> None:
    """Llama 3 8B, fp8 with layer 0 unquantized (4,096 B per token beside 2,048): from 0.25 the block
    is 32 (the fp8 page covers 16 bf16 tokens); every layer stays in one group of its own pages."""
    after = _plan(LLAMA_8B, "0.33.0", "--kv-cache-dtype-skip-layers", "0")
    assert (after.block_size, after.bytes_per_block) == (32, 32 * (4_096 + 31 * 2_048))
    before = _plan(LLAMA_8B, "0.24.0", "--kv-cache-dtype-skip-layers", "0")   # no alignment before 0.25
    assert (before.block_size, before.bytes_per_block) == (16, 16 * (4_096 + 31 * 2_048))
    plain = _plan(LLAMA_8B, "0.33.0")   # no skip layer: nothing to align
    assert (plain.block_size, plain.bytes_per_block) == (16, 16 * 32 * 2_048)


def test_sliding_layers_pad_to_the_skip_layers_shared_page() -> None:
    """Gemma 3 (5 sliding : 1 full, one KV head of 256), fp8, layer 0 (sliding) unquantized: the block
    grows to 32 and the shared page is 32 x 512 = 16,384 B; each sliding layer takes the largest
    kernel block fitting it (16 tokens for the bf16 one, 32 for the fp8 ones), so three specs of one
    page: 12 groups of 1 layer, and the engine's block is the smallest group's, 16."""
    p = _plan(GEMMA3, "0.33.0", "--kv-cache-dtype-skip-layers", "0")
    assert (p.block_size, p.bytes_per_block, p.kv_cache_groups) == (16, 16_384, 12)


def _deepseek_v3() -> dict:
    import copy
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fixtures.models.corpus import CORPUS
    return copy.deepcopy(CORPUS["deepseek_v3"]["config"])   # 4 MLA layers, latent 512 + 64 = 576


# DeepSeek-V3 (MLA, 4 layers), fp8 on an H100 (FLASHMLA: 64-token blocks). The platform compares the
# pages as FullAttentionSpec's, K and V of one head of the latent, so fp8 1,152 B beside bf16 2,304 B
# per token: the block grows to 2 x 64 = 128 from 0.25, whatever the list names (vLLM 0.25.1,
# vllm/platforms/interface.py:639). An MLA layer whose index is named keeps a bf16 latent (1,152 B a
# token beside 576) from 0.26 (mla_attention.py:403); 0.25 quantizes them all; "sliding_window" names
# no MLA layer. One group (one type, one block size), its block the sum of the four pages.
@pytest.mark.parametrize("release,skip,block,bytes_per_block", [
    ("0.24.0", ("0",), 64, 64 * 4 * 576),                  # no alignment, no MLA skip layer
    ("0.25.1", ("0",), 128, 128 * 4 * 576),                # the block grows, every layer still fp8
    ("0.26.0", ("0",), 128, 128 * (1_152 + 3 * 576)),
    ("0.33.0", ("0",), 128, 128 * (1_152 + 3 * 576)),
    ("0.33.0", ("0", "3"), 128, 128 * (2 * 1_152 + 2 * 576)),
    ("0.33.0", ("sliding_window",), 128, 128 * 4 * 576),  # no MLA layer reads it; the block grows all the same
    ("0.33.0", (), 64, 64 * 4 * 576),
])
def test_mla_skip_layers_grow_the_block_and_keep_a_bf16_latent_from_026(release, skip, block,
                                                                        bytes_per_block) -> None:
    flags = ("--kv-cache-dtype-skip-layers", *skip) if skip else ()
    p = _plan(_deepseek_v3(), release, *flags)
    assert (p.block_size, p.bytes_per_block, p.kv_cache_groups) == (block, bytes_per_block, 1)


def test_mla_skip_layer_boundaries_are_the_sources() -> None:
    from kvwatch.vllm_releases.skip_layer_pages import MLA_SKIP_LAYERS
    assert not MLA_SKIP_LAYERS.holds(parse_version("0.25.1")) and MLA_SKIP_LAYERS.holds(parse_version("0.26.0"))
