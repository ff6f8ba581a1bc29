"""The kernel block sizes of vLLM's CUDA attention backends where a release makes them depend on the
model, the card or the KV dtype (pure data).

A backend's `get_supported_kernel_block_sizes` (from 0.12; before, the block size in force is the
kernel's) decides which --block-size it accepts, the block a sliding-window layer starts from, and
the alignment of a hybrid's attention page to its recurrent state. kvwatch's rule set
(planner/rules.py) holds each backend's unconditional sizes; a row here replaces them where its
condition holds in its releases. Written by hand from each release's source; the oracle
scripts/check_release_functions.py (check cuda_kernel_blocks) runs each release's own methods on a
table of backends x cards x layouts x KV dtypes against `kernel_block_sizes`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from kvwatch.values.block_sizes import BlockSizeRule, MultipleOf
from kvwatch.values.versions import VllmVersion

# The KV dtypes vLLM does not count as quantized: is_quantized_kv_cache is get_kv_quant_mode != NONE,
# and every other name (fp8*, *_per_token_head, nvfp4*, turboquant_*, a registered handler's) has a
# mode (vLLM 0.29.0, vllm/v1/kv_cache_interface.py:83-101; 0.33.0 the same, :121-153)
UNQUANTIZED_KV = frozenset({"auto", "float16", "bfloat16", "float32"})


def is_quantized_kv(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype not in UNQUANTIZED_KV


class KernelContext(NamedTuple):
    """What the backends' methods read of the model, the card and the cache (vLLM's VllmConfig)."""
    capability: tuple[int, int] | None
    num_attention_heads: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    kv_cache_dtype: str = "auto"
    hybrid_state_float32: bool = False   # an attention + Mamba hybrid whose conv or SSM cache is float32
    softcap: bool = False                # config.json sets attn_logit_softcapping


def _gqa_on_sm100(c: KernelContext) -> bool:
    # FlashInfer's TRTLLM-gen kernels: SM 10.x, more query heads than KV heads, a whole ratio
    # (vllm/utils/flashinfer.py can_use_trtllm_attention; the NVIDIA artifactory reachable, batch
    # invariance off, TRTLLM not forced off: vLLM's defaults)
    return (c.capability is not None and c.capability[0] == 10 and c.num_kv_heads > 0
            and c.num_attention_heads // c.num_kv_heads > 1 and c.num_attention_heads % c.num_kv_heads == 0)


def _fa4_hd256(c: KernelContext) -> bool:
    # FA4 is the default FlashAttention on SM 10.x where the wheel has it (fa_utils.py
    # get_flash_attn_version); its head-256 kernel falls back to FA2 on soft capping or a quantized
    # KV cache (_fa4_hd256_fallback_reason)
    return (c.capability is not None and c.capability[0] == 10 and c.head_size == 256
            and c.head_size_v in (0, 256) and not c.softcap and not is_quantized_kv(c.kv_cache_dtype))


def _sm90_fa4_fp8_hd512(c: KernelContext) -> bool:
    # SM 9.x upgrades FA3 to FA4 for heads over 256; its FP8-KV dequant kernel pages by 64 tokens
    return (c.capability is not None and c.capability[0] == 9 and c.head_size == 512
            and c.kv_cache_dtype in ("fp8", "fp8_e4m3"))


class KernelBlocks(NamedTuple):
    backend: str
    since: tuple[int, int, int]
    until: tuple[int, int, int] | None   # the first release without the row (None: still there)
    sizes: tuple[BlockSizeRule, ...]
    when: Callable[[KernelContext], bool]
    preferred: bool                      # get_preferred_block_size also raises the default to it
    source: str


ROWS: tuple[KernelBlocks, ...] = (
    # 0.11 declares the sizes as a class variable, FlashAttention's without the multiples of 16
    KernelBlocks("FLASH_ATTN", (0, 11, 0), (0, 12, 0), (16, 32, 64), lambda c: True, False,
                 "vLLM 0.11.2, vllm/v1/attention/backends/flash_attn.py:63"),
    # "block sizes that do not suffer from the NaN propagation problem" of float32 Mamba states
    KernelBlocks("FLASH_ATTN", (0, 12, 0), (0, 25, 0), (16, 32, 64), lambda c: c.hybrid_state_float32, False,
                 "vLLM 0.12.0, vllm/v1/attention/backends/flash_attn.py:61 (to vLLM 0.24.0, flash_attn.py:77)"),
    # TRITON_MLA declares no sizes of its own before 0.18 (vLLM 0.18.1, triton_mla.py:45 declares
    # MultipleOf(16)): the base class's MultipleOf(1)
    KernelBlocks("TRITON_MLA", (0, 11, 0), (0, 18, 0), (MultipleOf(1),), lambda c: True, False,
                 "vLLM 0.12.0, vllm/attention/backends/abstract.py:51"),
    KernelBlocks("FLASH_ATTN", (0, 31, 0), None, (64,), _sm90_fa4_fp8_hd512, True,
                 "vLLM 0.31.0, vllm/v1/attention/backends/flash_attn.py:298"),
    # FA4_HD256_PAGE_SIZE (vLLM 0.29.0, vllm/v1/attention/backends/fa_utils.py:14)
    KernelBlocks("FLASH_ATTN", (0, 29, 0), None, (128,), _fa4_hd256, True,
                 "vLLM 0.29.0, vllm/v1/attention/backends/flash_attn.py:112"),
    # page sizes from 128 run only on the TRTLLM-gen kernel (0.24: any card it runs on, SM 10.x;
    # 0.25 also asks for the SM 10.x family itself, flashinfer.py:343)
    KernelBlocks("FLASHINFER", (0, 24, 0), None, (16, 32, 64, 128, 256, 512, 1024), _gqa_on_sm100, False,
                 "vLLM 0.24.0, vllm/v1/attention/backends/flashinfer.py:338"),
)
# vLLM 0.31.0, flash_attn.py:355 asks the SM 9.x FP8 row before the head-256 one; ROWS keeps that order.
# From 0.12 a backend accepts any block size that is a multiple of one of its kernel blocks, a fixed
# one included (the hybrid-blocks feature: vLLM 0.12.0, vllm/attention/backends/abstract.py:137
# supports_block_size); 0.11 accepts a fixed size only as itself (vLLM 0.11.2,
# vllm/attention/backends/abstract.py:108). Until 0.17 the size must also be one of CacheConfig's
# BlockSize literals (vLLM 0.12.0, vllm/config/cache.py:22), which --block-size's choices enforce.
BLOCK_MULTIPLES_ACCEPTED_SINCE = (0, 12, 0)


def accepts_multiples(version: VllmVersion) -> bool:
    return version.parts >= BLOCK_MULTIPLES_ACCEPTED_SINCE


def _row_for(backend: str, version: VllmVersion, context: KernelContext) -> KernelBlocks | None:
    v = version.parts
    for row in ROWS:
        if row.backend != backend or v < row.since or (row.until is not None and v >= row.until):
            continue
        if row.when(context):
            return row
    return None


def kernel_block_sizes(backend: str, version: VllmVersion, context: KernelContext
                       ) -> tuple[BlockSizeRule, ...] | None:
    """The backend's kernel block sizes in this release for this model and card where a row of
    ROWS says so; None where the rule set's unconditional sizes hold."""
    row = _row_for(backend, version, context)
    return row.sizes if row is not None else None


def preferred_block_size(backend: str, version: VllmVersion, context: KernelContext,
                         default: int) -> int:
    """The block size the backend asks for when --block-size is unset (get_preferred_block_size):
    the default, raised to a row's single kernel block where the row says so."""
    row = _row_for(backend, version, context)
    if row is None or not row.preferred:
        return default
    return max(default, max(s.base if isinstance(s, MultipleOf) else s for s in row.sizes))


def source_of(backend: str, version: VllmVersion, context: KernelContext) -> str | None:
    row = _row_for(backend, version, context)
    return row.source if row is not None else None
