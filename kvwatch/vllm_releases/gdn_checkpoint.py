"""The gated delta net layer's prefill checkpoint, per vLLM release (pure data).

From 0.33 a Qwen gated delta net layer (QwenGatedDeltaNetAttention: Qwen3-Next, Qwen3.5 and the
models built on them) whose prefill runs on FlashInfer's GDN kernel exports a checkpoint state from
inside a prefill when prefix caching keeps states aligned (mamba_cache_mode "align"). That costs:

- one more state block per request: its spec gets num_prefill_checkpoint_blocks=1, so
  MambaSpec.max_memory_usage_bytes holds 2 + 1 pages in align mode (the page itself is unchanged:
  the spec is the base one with the checkpoint fields replaced);
- a coarser hybrid block size: the platform's alignment takes the lcm with the layers' checkpoint
  alignment, 64 tokens, before it sizes the attention page to hold one state.

Before 0.33 the class keeps its base spec (no checkpoint) and declares no alignment. Checked against
each release's own code by scripts/check_release_functions.py (checks gdn_checkpoint and
hybrid_block_size).
"""
from __future__ import annotations

from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases.kv_layout import Boundary

_LAYER = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"

# QwenGatedDeltaNetAttention.get_kv_cache_spec: one prefill checkpoint block, when the layer exports
# checkpoints; 0.32 has no get_kv_cache_spec of its own (MambaBase's, no checkpoint).
GDN_PREFILL_CHECKPOINT = Boundary((0, 33, 0), f"vLLM 0.33.0, {_LAYER}:739",
                                  "vLLM 0.32.0, vllm/model_executor/layers/mamba/abstract.py:65")
GDN_CHECKPOINT_BLOCKS = 1   # vLLM 0.33.0, vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:748

# The layer's checkpoint alignment (get_prefill_checkpoint_alignment) in align mode on FlashInfer's
# prefill: FLASHINFER_GDN_CHECKPOINT_ALIGNMENT (vLLM 0.33.0, vllm/v1/attention/backends/gdn_attn.py:34;
# set at qwen_gdn_linear_attn.py:696). Other prefill backends declare none, and then no layer exports.
FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64
# _align_hybrid_block_size takes the lcm of the kernel alignment and the layers' checkpoint alignment
# in align mode (vLLM 0.33.0, vllm/platforms/interface.py:1090); 0.32 has no such step.
GDN_CHECKPOINT_HYBRID_ALIGNMENT_SOURCE = "vLLM 0.33.0, vllm/platforms/interface.py:1090"

# _resolve_gdn_prefill_backend (vLLM 0.33.0, qwen_gdn_linear_attn.py:249-266): FlashInfer when
# --gdn-prefill-backend is flashinfer or not given ("auto", arg_utils.py:2865 passes it on in
# additional_config), on CUDA compute capability 9.0, or on the 10.x and 12.x families when the linear
# key heads are 128 wide and the CUDA runtime is 13 or newer (the runtime 0.33's wheels are built
# for). Never on the CPU, ROCm or XPU; another backend asked for runs Triton or CuteDSL.
FLASHINFER_GDN_CAPABILITY = (9, 0)
FLASHINFER_GDN_FAMILIES_WITH_K128 = (10, 12)
FLASHINFER_GDN_HEAD_K_DIM = 128
FLASHINFER_GDN_REQUESTS = (None, "auto", "flashinfer")

# Where the layer reads the backend asked for: additional_config's "gdn_prefill_backend" ("auto" when
# the key is absent or additional_config is not a dict), as str(value).strip().lower() (vLLM 0.33.0,
# vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:175-181), so --additional-config
# '{"gdn_prefill_backend": "FlashInfer"}' asks for flashinfer and a JSON null for "none" (Triton).
# --gdn-prefill-backend, when given, overwrites the key (vLLM 0.33.0, vllm/engine/arg_utils.py:2865-2866):
# the flag wins over --additional-config.
GDN_PREFILL_BACKEND_KEY = "gdn_prefill_backend"


def requested_gdn_prefill_backend(flag: str | None, additional_config: object) -> str | None:
    """The GDN prefill backend the layer reads from --gdn-prefill-backend (`flag`) and the parsed
    --additional-config (None: "auto", neither asks)."""
    if flag is None:
        if not (isinstance(additional_config, dict) and GDN_PREFILL_BACKEND_KEY in additional_config):
            return None
        flag = additional_config[GDN_PREFILL_BACKEND_KEY]
    return str(flag).strip().lower()


def flashinfer_gdn_prefill(platform: str, capability: tuple[int, int] | None, head_k_dim: int,
                           requested: str | None = None) -> bool:
    """Whether 0.33 runs the GDN prefill on FlashInfer on this device (`requested`: the backend asked for,
    requested_gdn_prefill_backend)."""
    if platform != "cuda" or capability is None or requested not in FLASHINFER_GDN_REQUESTS:
        return False
    return capability == FLASHINFER_GDN_CAPABILITY or (
        capability[0] in FLASHINFER_GDN_FAMILIES_WITH_K128 and head_k_dim == FLASHINFER_GDN_HEAD_K_DIM)


def gdn_checkpoint_alignment(version: VllmVersion | None, platform: str, capability: tuple[int, int] | None,
                             head_k_dim: int, mamba_align: bool, requested: str | None = None) -> int | None:
    """The token alignment a gated delta net layer's prefill checkpoint asks of the hybrid block size
    (None: the layer exports no checkpoint, so it adds no block and no alignment)."""
    if not (mamba_align and GDN_PREFILL_CHECKPOINT.holds(version)
            and flashinfer_gdn_prefill(platform, capability, head_k_dim, requested)):
        return None
    return FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
