"""What vLLM decides about the KV cache layout where releases differ (pure data).

Read from each release's source (the CPU platform, the attention and Mamba layers), and checked on the real CPU engines 0.27 to 0.32
(tests/fixtures/release_truths, tests/test_release_corpus.py). A boundary is the first release that
behaves the new way; `source` is the line that shows it, `before` the line of the last release
that did not. Releases kvwatch has no engine for are placed by their source alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.values.versions import VllmVersion


@dataclass(frozen=True)
class Boundary:
    since: tuple[int, int, int]
    source: str
    before: str

    def holds(self, version: VllmVersion | None) -> bool:
        """Whether `version` behaves the new way (None: the newest release kvwatch knows does)."""
        return version is None or version.parts >= self.since


# An MLA model on the CPU: 0.27 refuses it while choosing the attention backend; from 0.28 a
# reference CPU MLA backend (CPU_MLA) serves it.
CPU_MLA_BACKEND = Boundary((0, 28, 0), "vLLM 0.28.0, vllm/platforms/cpu.py:90",
                           "vLLM 0.27.0, vllm/platforms/cpu.py:84")
MLA_NOT_SUPPORTED_ON_CPU = "MLA is not supported on CPU."
# From 0.29 an x86 host with AMX tiles (torch.cpu._is_amx_tile_supported) runs MLA on AMX_MLA instead,
# unless --attention-backend CPU_MLA; its platform then forces no 16-token block and keeps chunked
# prefill and prefix caching on (cpu.py:215-221, :442 in 0.29). 0.28 always picks CPU_MLA.
AMX_MLA_BACKEND = Boundary((0, 29, 0), "vLLM 0.29.0, vllm/platforms/cpu.py:147-159",
                           "vLLM 0.28.0, vllm/platforms/cpu.py:91-98")

# 0.28's CPU MLA backend cannot start: every dense MLA layer picks its prefill backend
# (vLLM 0.28.0, vllm/model_executor/layers/attention/mla_attention.py:560) by the device's
# capability, which the CPU has none of, so FlashAttention's (vLLM 0.28.0,
# vllm/v1/attention/backends/mla/prefill/selector.py:111), whose module imports a name that
# fa_utils defines on CUDA, XPU and ROCm only (vLLM 0.28.0,
# vllm/v1/attention/backends/mla/prefill/flash_attn.py:18, fa_utils.py:18). From 0.29 the CPU
# takes its own SDPA prefill. A sparse MLA layer picks no dense prefill (mla_attention.py:552).
CPU_MLA_SDPA_PREFILL = Boundary((0, 29, 0), "vLLM 0.29.0, vllm/v1/attention/backends/mla/prefill/selector.py:110",
                                "vLLM 0.28.0, vllm/v1/attention/backends/mla/prefill/selector.py:111")
CPU_MLA_PREFILL_IMPORT_ERROR = ("ImportError: cannot import name 'compile_flash_attn_varlen_func_from_specs' "
                                "from 'vllm.v1.attention.backends.fa_utils'")

# The SSM state dtype: from 0.29 the CPU keeps SSM states in float32 wherever AVX-512 BF16 is
# there (the accelerated state kernels); 0.27 and 0.28 only with AMX tiles ("AMX GDN requires
# float32 state"), so a CPU with AVX-512 BF16 and no AMX keeps the model's dtype.
SSM_FLOAT32_WITH_AVX512_BF16 = Boundary((0, 29, 0), "vLLM 0.29.0, vllm/platforms/cpu.py:241",
                                        "vLLM 0.28.0, vllm/platforms/cpu.py:157")

# The CPU prepacks every causal-conv weight (the non-2D weights of Mamba, gated-delta-net and
# short-conv layers) for its C++ kernel, which takes a width of 4 only: a conv of another width
# (LFM2's conv_L_cache 3) fails while the model loads, "RuntimeError: causal_conv1d_weight_pack:
# support only width of 4" (recorded on 0.30's and 0.31's engines). The prepack runs with AMX tiles
# from 0.22, wherever AVX-512 BF16 is from 0.29, and from 0.32 only for a 4-wide bfloat16 weight
# (any other runs unpacked). `cpu_conv_prepack` reads the rows.
CPU_CONV_PREPACK: tuple[tuple[tuple[int, int, int], str, str], ...] = (   # (since, CPU feature, source)
    ((0, 0, 0), "", "vLLM 0.21.0, vllm/model_executor/layers/utils.py:220"),
    ((0, 22, 0), "amx_tile", "vLLM 0.22.1, vllm/model_executor/layers/utils.py:240"),
    ((0, 29, 0), "avx512_bf16", "vLLM 0.29.0, vllm/model_executor/layers/utils.py:451"),
    ((0, 32, 0), "", "vLLM 0.32.0, vllm/model_executor/layers/utils.py:492"),
)
CPU_CONV_PREPACK_REFUSED = "RuntimeError: causal_conv1d_weight_pack: support only width of 4"
# A float32 conv weight the prepack meets (Kimi Delta Attention's, 4 wide) fails in the same kernel
# (recorded on 0.29's and 0.30's engines, vllm/_custom_ops.py causal_conv1d_weight_pack)
CPU_CONV_PREPACK_FLOAT_REFUSED = "NotImplementedError: \"causal_conv1d_fwd_kernel_impl\" not implemented for 'Float'"

# Prefix caching on a Mamba model: mamba_cache_mode "none" becomes "all" (a state per block of tokens,
# cdiv(max_model_len, block_size) per request) where the model class supports Mamba prefix caching, else
# "align" (2 per request), from 0.15 to 0.27 (vLLM 0.27.1, vllm/model_executor/models/config.py:614-616);
# from 0.28 always "align" (vLLM 0.28.0, vllm/model_executor/models/config.py:603-604). The classes are
# the models that subclass SupportsMambaPrefixCaching (vLLM 0.27.1, vllm/model_executor/models/*.py).
MAMBA_ALIGN_BY_DEFAULT = Boundary((0, 28, 0), "vLLM 0.28.0, vllm/model_executor/models/config.py:603-604",
                                  "vLLM 0.27.1, vllm/model_executor/models/config.py:614-616")
MAMBA_PREFIX_CACHING_CLASSES = frozenset({   # and Bamba's while vLLM had it (vLLM 0.15.1, models/bamba.py)
    "BambaForCausalLM", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "JambaForCausalLM", "Mamba2ForCausalLM",
    "MambaForCausalLM", "NemotronHForCausalLM", "Zamba2ForCausalLM"})
# Speculative decoding: MambaSpec.max_memory_usage_bytes counts num_speculative_blocks (num_speculative_tokens,
# model_executor/layers/mamba/abstract.py) more states per request, from 0.15 (vLLM 0.15.1,
# vllm/v1/kv_cache_interface.py:293-300; 0.14.1 :292-294 sized a state per block of max_model_len instead).
MAMBA_SPECULATIVE_BLOCKS = Boundary((0, 15, 0), "vLLM 0.15.1, vllm/v1/kv_cache_interface.py:293-300",
                                    "vLLM 0.14.1, vllm/v1/kv_cache_interface.py:292-294")
# ... and in mode "all" (a state per block of max_model_len) from 0.22 (vLLM 0.22.1, kv_cache_interface.py:583-587).
MAMBA_ALL_SPECULATIVE_BLOCKS = Boundary((0, 22, 0), "vLLM 0.22.1, vllm/v1/kv_cache_interface.py:583-587",
                                        "vLLM 0.21.0, vllm/v1/kv_cache_interface.py:563-565")
# MambaSpec.max_memory_usage_bytes per mode (vLLM 0.27.1, vllm/v1/kv_cache_interface.py:729-738)
MAMBA_MODE_SOURCE = "vLLM 0.27.1, vllm/v1/kv_cache_interface.py:729-738"


# Kimi Delta Attention's model imports NVIDIA's cute-DSL GEMM, and with it the cutlass package, while
# the model is built from 0.31 (maybe_init_gemm_rs_ar); 0.29 and 0.30 import it later, so there the
# model loads and its weights reach the CPU's conv prepack first.
KDA_CUTLASS_AT_MODEL_INIT = Boundary((0, 31, 0), "vLLM 0.31.0, vllm/models/kimi_k3/nvidia/model.py:169",
                                     "vLLM 0.30.0, vllm/models/kimi_k3/nvidia/kda.py:786")


def cpu_conv_prepack(version: VllmVersion | None) -> tuple[str, str]:
    """The CPU feature under which `version` prepacks a conv weight of any width ("": none does),
    and the source line that shows it (None: the newest release)."""
    parts = version.parts if version is not None else (10**6, 0, 0)
    return [(feature, source) for since, feature, source in CPU_CONV_PREPACK if parts >= since][-1]


# No flag avoids the prepack on the releases that do it: it asks only the CPU (vLLM 0.29.0,
# vllm/model_executor/layers/utils.py:451; 0.22.1, :240), not the weight's dtype or width, and the
# short conv is built with no quantization config (vLLM 0.29.0,
# vllm/model_executor/layers/mamba/short_conv.py:56), so --dtype and --quantization leave it on the
# unquantized path that prepacks (vLLM 0.29.0, vllm/model_executor/layers/linear.py:215).
CPU_CONV_PREPACK_NO_FLAG = ("vLLM 0.29.0, vllm/model_executor/layers/utils.py:451; "
                            "vllm/model_executor/layers/mamba/short_conv.py:56")


def cpu_conv_prepack_releases() -> tuple[str, str, str]:
    """The first release that prepacks a conv of any width, the first that no longer does, and the
    source line of the latter (read from CPU_CONV_PREPACK's rows)."""
    first = next(i for i, row in enumerate(CPU_CONV_PREPACK) if row[1])
    fixed = next(row for row in CPU_CONV_PREPACK[first:] if not row[1])
    return (".".join(map(str, CPU_CONV_PREPACK[first][0][:2])), ".".join(map(str, fixed[0][:2])), fixed[2])


# A Mamba-2 layer (MambaMixer2) with prefix caching ("align" mode) keeps one prefill checkpoint
# state per request beside its 2 running ones, from 0.32; before, 2 (MambaSpec
# max_memory_usage_bytes, vLLM 0.31.0, vllm/v1/kv_cache_interface.py:1091: MambaMixer2 asks for no checkpoint).
MAMBA2_PREFILL_CHECKPOINT = Boundary((0, 32, 0), "vLLM 0.32.0, vllm/model_executor/layers/mamba/mamba_mixer2.py:1107",
                                     "vLLM 0.31.0, vllm/v1/kv_cache_interface.py:1091")

# Prefix caching for a hybrid (attention beside Mamba or linear-attention layers) with no flag: on
# from 0.28, like any decoder; 0.27 keeps it opt-in ("while the feature matures"), so its state
# layers hold 1 block per request, not 2.
HYBRID_PREFIX_CACHING_BY_DEFAULT = Boundary((0, 28, 0), "vLLM 0.28.0, vllm/engine/arg_utils.py:2650",
                                            "vLLM 0.27.0, vllm/engine/arg_utils.py:2604")

# What a sliding-window or chunked-local layer keeps per request on top of its window: from 0.26 every
# batch in flight (VllmConfig.max_in_flight_tokens, max_concurrent_batches x max_num_batched_tokens), before
# one batch of max_num_batched_tokens. It sizes the per-request demand that the logged token count divides by.
IN_FLIGHT_TOKENS = Boundary((0, 26, 0), "vLLM 0.26.0, vllm/config/vllm.py:525 and vllm/v1/kv_cache_interface.py:584",
                            "vLLM 0.25.0, vllm/v1/kv_cache_interface.py:561")

# The null block the block pool holds back: the auto-fit of --max-model-len and the check that one
# request fits plan against the memory without it from 0.29; before, against all of it (Llama 3
# with --max-model-len auto on 1 GiB: 131,072 on 0.27, 130,944 from 0.29).
NULL_BLOCK_RESERVED_IN_CHECK = Boundary((0, 29, 0), "vLLM 0.29.0, vllm/v1/core/kv_cache_utils.py:2316",
                                        "vLLM 0.28.0, vllm/v1/core/kv_cache_utils.py:2185")

# The kernel block sizes CPU_ATTN declares, as MultipleOf(base) from the release on: none of its own
# before 0.21 (the backend default, any size), multiples of 16 from 0.21 to 0.28, of 32 from 0.29.
CPU_ATTN_KERNEL_MULTIPLE: tuple[tuple[tuple[int, int, int], int, str], ...] = (
    ((0, 0, 0), 1, "vLLM 0.20.2, vllm/v1/attention/backend.py:70"),
    ((0, 21, 0), 16, "vLLM 0.21.0, vllm/v1/attention/backends/cpu_attn.py:56"),
    ((0, 29, 0), 32, "vLLM 0.29.0, vllm/v1/attention/backends/cpu_attn.py:61"),
)


def cpu_attn_kernel_multiple(version: VllmVersion | None) -> int:
    """The base of CPU_ATTN's MultipleOf kernel block sizes in `version` (None: the newest)."""
    parts = version.parts if version is not None else (10**6, 0, 0)
    return [base for since, base, _source in CPU_ATTN_KERNEL_MULTIPLE if parts >= since][-1]


# The block size a sliding-window layer starts from (its get_kv_cache_spec), before
# unify_kv_cache_spec_page_size scales the smaller pages up by an integer ratio. Up to 0.24 the
# block size in force. From 0.25 the layer picks a kernel block of its backend: to 0.29 the
# smallest one (no page budget: "the smallest block is fine"); from 0.30 the largest whose page
# fits the page of the block size in force. It shows where the sliding layers' page per token
# is wider than the full ones' (Gemma 4 31B: 16,384 B beside 8,192 B): on 0.28 CPU_ATTN's 16
# tokens, scaled x4 to the full layers' 1 MiB page, give 64-token blocks, and the engine's block
# size is its groups' smallest (vLLM 0.28.0, vllm/v1/engine/core.py:322); from 0.30 the sliding
# layers keep 128 and the full ones take 256. (0.25.0 is placed by 0.25.1's source.)
SLIDING_BLOCK_FROM_KERNEL = Boundary((0, 25, 0), "vLLM 0.25.1, vllm/model_executor/layers/attention/attention.py:650",
                                     "vLLM 0.24.0, vllm/model_executor/layers/attention/attention.py:599")
SLIDING_BLOCK_WITHIN_PRIMARY_PAGE = Boundary((0, 30, 0),
                                             "vLLM 0.30.0, vllm/model_executor/layers/attention/attention.py:648",
                                             "vLLM 0.29.0, vllm/model_executor/layers/attention/attention.py:118")
# From 0.34, without a shared (skip-layer) page, the sliding layers prefer the largest fitting kernel
# block that divides the primary block, so that their page scales to it by a whole ratio instead of
# being padded (Gemma-like models on FLASHINFER at block 80: 16 tokens, not 64).
SLIDING_BLOCK_DIVIDES_PRIMARY = Boundary((0, 34, 0),
                                         "vLLM 0.34.0, vllm/model_executor/layers/attention/attention.py:134-144,:683-693",
                                         "vLLM 0.33.0, vllm/model_executor/layers/attention/attention.py")

# Layers of more than one type whose pages differ in size (sliding layers of 8 heads of 256 beside
# full ones of 2 heads of 512): from 0.12 vLLM unifies the pages (a larger block, or padding) and
# groups them; 0.11 groups mixed types only when every page is the same size, and raises a bare
# NotImplementedError otherwise.
KV_PAGE_UNIFICATION = Boundary((0, 12, 0), "vLLM 0.12.0, vllm/v1/core/kv_cache_utils.py:885",
                               "vLLM 0.11.2, vllm/v1/core/kv_cache_utils.py:1177")

# --disable-hybrid-kv-cache-manager on layers that do not promote to one type (Mamba or
# linear-attention layers beside attention): every release refuses it with a ValueError, worded
# anew from 0.27.
HYBRID_PROMOTION_WORDING = Boundary((0, 27, 0), "vLLM 0.27.1, vllm/v1/core/kv_cache_utils.py:1529",
                                    "vLLM 0.26.0, vllm/v1/core/kv_cache_utils.py:1520")
HYBRID_PROMOTION_REFUSED = "Failed to promote local KV cache specs to one unified type."
HYBRID_PROMOTION_REFUSED_BEFORE = ("Hybrid KV cache manager is disabled but failed to convert the KV cache specs "
                                   "to one unified type.")

# A model with chunked local attention (Llama 4): 0.11 to 0.13 turn the hybrid KV cache manager off
# ("a latency regression", VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE default 0), so the
# chunked layers are kept as full attention; from 0.14 the default is 1 and the manager stays on.
# (vLLM 0.13.0, vllm/config/vllm.py:907 reads the variable where the model has attention_chunk_size.)
CHUNKED_LOCAL_KEEPS_HYBRID_MANAGER = Boundary((0, 14, 0), "vLLM 0.14.1, vllm/envs.py:1469",
                                              "vLLM 0.13.0, vllm/envs.py:1433")


@dataclass(frozen=True)
class GroupingRule:
    """How a release's get_kv_cache_groups splits buckets of layers (one bucket per spec) into
    groups of one size: the smallest bucket's count, or the largest's when it is under
    `near_equal` times the smallest (fewer padding layers); each group takes every n-th layer of
    its bucket (`strided`) or consecutive ones; and whether layers of one type but different page
    sizes (full attention of two head sizes) make one group (`uniform_type`) or are refused."""
    since: tuple[int, int, int]
    near_equal: float | None
    strided: bool
    uniform_type: bool
    source: str


GROUPING_RULES = (
    GroupingRule((0, 10, 0), None, False, False, "vLLM 0.10.2, vllm/v1/core/kv_cache_utils.py:981"),
    GroupingRule((0, 11, 0), None, True, True, "vLLM 0.11.2, vllm/v1/core/kv_cache_utils.py:997"),
    GroupingRule((0, 12, 0), 1.25, True, True, "vLLM 0.12.0, vllm/v1/core/kv_cache_utils.py:1017"),
    GroupingRule((0, 18, 0), 1.5, True, True, "vLLM 0.18.1, vllm/v1/core/kv_cache_utils.py:1043"),
)


def grouping_rule_for(version: VllmVersion | None) -> GroupingRule:
    """The rule of `version` (None: the newest kvwatch knows)."""
    if version is None:
        return GROUPING_RULES[-1]
    return next((r for r in reversed(GROUPING_RULES) if version.parts >= r.since), GROUPING_RULES[0])


# V0 from 0.7.2 until 0.8 pads an MLA layer's latent entry (kv_lora_rank + qk_rope_head_dim, 576 for
# DeepSeek) to 256 bytes in the model dtype on CUDA (VLLM_CUDA_MEM_ALIGN_KV_CACHE, on by default:
# vLLM 0.7.2, vllm/worker/cache_engine.py:131-160, vllm/utils.py:801-804, vllm/envs.py:573-574; the
# same in 0.7.3): 640 elements in bf16. 0.7.1 has no padding (vLLM 0.7.1, vllm/worker/cache_engine.py),
# nor 0.8.0 (vLLM 0.8.0, vllm/worker/cache_engine.py).
MLA_ENTRY_ALIGNED_SINCE = (0, 7, 2)
MLA_ENTRY_ALIGNED_UNTIL = (0, 8, 0)
MLA_ALIGN_ENV = "VLLM_CUDA_MEM_ALIGN_KV_CACHE"


def mla_entry_elements(entry: int, model_dtype_bytes: int, version: VllmVersion | None, platform: str,
                       env: dict[str, str] | None = None) -> int:
    """The elements one token's MLA latent takes in a layer's cache on this release and platform."""
    if version is None or not MLA_ENTRY_ALIGNED_SINCE <= version.parts < MLA_ENTRY_ALIGNED_UNTIL:
        return entry
    if platform != "cuda" or (env or {}).get(MLA_ALIGN_ENV, "1").strip() == "0":
        return entry
    per_256 = 256 // max(1, model_dtype_bytes)
    return -(-entry // per_256) * per_256
