"""Which fused-MoE kernel a quantized MoE checkpoint runs, and so what it adds to the profile: the modular
kernel's workspaces it keeps, the tiles it pads MXFP4 experts to (pure data, read from vLLM's code).

The modular kernel takes its workspaces from the global workspace manager, which keeps them allocated
(vLLM 0.27.0, model_executor/layers/fused_moe/modular_kernel.py:1167 get_simultaneous; 0.19.0 :1063): the
profile then ends with them held, and the budget charges them (gpu_budget.moe_workspace_bytes). Unquantized
experts run it from 0.14 (gpu_budget.MOE_WORKSPACE_SINCE); of the quantized ones:

- **Block FP8** (128x128 weight blocks, dynamic per-token-group activations), vLLM's own CUTLASS kernel left
  out (quantization/fp8.py:521 allow_vllm_cutlass=False), picks from a priority list (0.27.0
  fused_moe/oracle/fp8.py:69-122 `_get_priority_backends`, :271-404 `select_fp8_moe_backend`; the same in
  0.19.0 and 0.33.0): on Hopper without expert parallelism the Triton experts go first (:112-122); on SM 12.x
  FlashInfer's TRT-LLM kernels need the SM100 family, its CUTLASS kernels take block FP8 only on SM 9.0
  (experts/flashinfer_cutlass_moe.py:149-184) and DeepGEMM only Hopper and Blackwell (utils/deep_gemm.py:94-99),
  so the Triton experts run. Their workspaces are the unquantized experts' shapes.
- **GPTQ/AWQ 4- and 8-bit** (WNA16) run the modular kernel from 0.20 (0.20.0 quantization/gptq_marlin.py:762
  make_wna16_moe_kernel; 0.19.0 :905 still called fused_marlin_moe, whose caches are freed), Marlin first on
  every card but the SM100 family, where FlashInfer's TRT-LLM kernel comes first (0.27.0
  fused_moe/oracle/int_wna16.py:108-124).
- **MXFP4 on Marlin**, the default below SM 9.0 or asked for with `--moe-backend marlin`, from 0.19
  (0.19.0 quantization/mxfp4.py:319 make_mxfp4_moe_kernel).
MarlinExperts' workspaces are (M x top-k, max(I, K)) and M x top-k x max(2I, K) for the rank's expert width I
(0.31.0 fused_moe/experts/marlin_moe.py:648-716, N = marlin_moe_intermediate_size): the Triton shapes again.

MXFP4 experts are allocated padded to the kernel's tiles (intermediate size per rank, hidden size): Marlin
rounds to 128 / 256 (0.10.2 quantization/mxfp4.py; 0.19.1 fused_moe/oracle/mxfp4.py
mxfp4_round_up_hidden_size_and_intermediate_size; 0.31.0 the same function, :752-757, and `moe_backend='marlin'`
mapped to it at :320). FlashInfer's TRT-LLM kernels, the default on the SM100 family where FlashInfer is
installed (0.13.0 quantization/mxfp4.py:106-140; from 0.19 first in the oracle's list for gpt-oss, 0.31.0
oracle/mxfp4.py:342-360, SM100 only experts/trtllm_mxfp4_moe.py:121-123), round to 256 / 256 in 0.13.0
(quantization/mxfp4.py:302-312, the releases between read as 0.13) and to 128 / 256 from 0.19.0
(oracle/mxfp4.py:386-388; 0.31.0 :758-760). Hopper's Triton kernel and its Marlin fallback before 0.12 are
planner/weights.py's mxfp4_triton_hopper_bytes.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BLOCK_FP8_TRITON_SINCE = (0, 19, 0)   # read in 0.19.0, 0.27.0, 0.28.0, 0.31.0 and 0.33.0
WNA16_MODULAR_SINCE = (0, 20, 0)
MXFP4_MODULAR_SINCE = (0, 19, 0)
_WNA16 = ("gptq", "awq", "gptq_marlin", "awq_marlin")
MARLIN_TILES = (128, 256)
TRTLLM_TILES_BEFORE_0_19 = (256, 256)
TRTLLM_TILES = (128, 256)
TRTLLM_ORACLE_SINCE = (0, 19, 0)


# VLLM_MXFP4_USE_MARLIN=1 asks MXFP4 experts for Marlin where the release reads it (envs.maybe_convert_bool:
# bool(int(value))): in 0.17.0's fallback after FlashInfer's SM100 branches (quantization/mxfp4.py:164), and
# first on any card in 0.22.0 and 0.23.0, deprecated for --moe-backend marlin (fused_moe/oracle/mxfp4.py:526,
# envs.py:1328 / :1366). 0.10.2 declares it and reads it nowhere, 0.19.0's oracle only on its LoRA path
# (:217), 0.24.0 and 0.25.0 not at all; the releases between read as the nearer one read here.
MXFP4_MARLIN_ENV = "VLLM_MXFP4_USE_MARLIN"
MXFP4_MARLIN_ENV_READ = (((0, 17, 0), (0, 19, 0), False), ((0, 22, 0), (0, 24, 0), True))   # (since, until, SM100 too)


def moe_backend_asked(moe_backend: str | None, quantization: Mapping[str, Any] | None, env: Mapping[str, str],
                      version: tuple[int, int, int], capability: tuple[int, int] | None) -> str | None:
    """The MoE backend asked for: `--moe-backend`, else "marlin" where VLLM_MXFP4_USE_MARLIN=1 asks an MXFP4
    checkpoint for it and the release reads the variable (MXFP4_MARLIN_ENV_READ)."""
    if (moe_backend or "auto").strip().lower() != "auto" or _method(quantization) != "mxfp4" or capability is None:
        return moe_backend
    try:
        asked = bool(int(env.get(MXFP4_MARLIN_ENV, "0")))
    except ValueError:   # vLLM's own bool(int(...)) fails on it: nothing is asked that a plan can follow
        return moe_backend
    read = any(since <= version < until and (sm100_too or capability[0] != 10)
               for since, until, sm100_too in MXFP4_MARLIN_ENV_READ)
    return "marlin" if asked and read else moe_backend


def marlin_asked(moe_backend: str | None) -> bool:
    """`--moe-backend marlin` (a flag from 0.17: vllm_releases/generated/flags.py): the MoE layers run Marlin."""
    return (moe_backend or "").strip().lower() == "marlin"


def mxfp4_marlin(capability: tuple[int, int], moe_backend: str | None) -> bool:
    """MXFP4 experts run Marlin: the default below SM 9.0, or asked for."""
    return capability < (9, 0) or marlin_asked(moe_backend)


def mxfp4_expert_tiles(capability: tuple[int, int] | None, version: tuple[int, int, int],
                       moe_backend: str | None = None) -> tuple[int, int] | None:
    """The (intermediate, hidden) rounding of the MXFP4 MoE kernel the release runs on this card; None
    where its default kernel keeps gpt-oss's sizes or is Hopper's (planner/weights.py)."""
    if capability is None:
        return None
    if mxfp4_marlin(capability, moe_backend):
        return MARLIN_TILES
    if capability[0] == 10:
        return TRTLLM_TILES if version >= TRTLLM_ORACLE_SINCE else TRTLLM_TILES_BEFORE_0_19
    return None


def _method(quantization: Mapping[str, Any] | None) -> str:
    return str((quantization or {}).get("quant_method", "")).lower()


def block_fp8(quantization: Mapping[str, Any] | None) -> bool:
    """config.json's quantization_config is FP8 with weight blocks (DeepSeek-V3/Qwen3-FP8 style)."""
    return _method(quantization) == "fp8" and bool((quantization or {}).get("weight_block_size"))


def triton_block_fp8_experts(quantization: Mapping[str, Any] | None, capability: tuple[int, int] | None,
                             expert_parallel: bool, version: tuple[int, int, int]) -> bool:
    """A block-FP8 MoE checkpoint runs vLLM's Triton experts, with their kept workspaces."""
    if not block_fp8(quantization) or capability is None or version < BLOCK_FP8_TRITON_SINCE:
        return False
    return (capability == (9, 0) and not expert_parallel) or capability[0] == 12


def marlin_experts(quantization: Mapping[str, Any] | None, capability: tuple[int, int] | None,
                   version: tuple[int, int, int], moe_backend: str | None = None) -> bool:
    """A GPTQ/AWQ or MXFP4 MoE checkpoint runs MarlinExperts through the modular kernel."""
    if capability is None:
        return False
    method = _method(quantization)
    if method in _WNA16:
        return version >= WNA16_MODULAR_SINCE and capability[0] != 10
    if method == "mxfp4":
        return version >= MXFP4_MODULAR_SINCE and mxfp4_marlin(capability, moe_backend)
    return False


def quantized_experts_keep_workspace(quantization: Mapping[str, Any] | None, capability: tuple[int, int] | None,
                                     expert_parallel: bool, version: tuple[int, int, int],
                                     moe_backend: str | None = None) -> bool:
    """The checkpoint's quantized experts keep the modular kernel's workspaces (Triton block FP8, Marlin)."""
    return triton_block_fp8_experts(quantization, capability, expert_parallel, version) \
        or marlin_experts(quantization, capability, version, moe_backend)
