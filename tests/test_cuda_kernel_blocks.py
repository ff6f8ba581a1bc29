"""The CUDA backends' kernel block sizes per release (vllm_releases/cuda_kernel_blocks.py) and what
they change in a GPU plan: the backend that accepts --block-size, the block size it prefers, the
block a sliding-window layer starts from. vLLM's own methods agree on every input of
scripts/check_release_functions.py (check cuda_kernel_blocks; tests/test_release_oracles.py)."""
from __future__ import annotations

import pytest

from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.block_sizes import MultipleOf
from kvwatch.values.versions import parse_version

GEMMA3 = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 12,
          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 2048,
          "sliding_window": 512, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
GEMMA2 = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 8,
          "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 2048,
          "sliding_window": 4096, "attn_logit_softcapping": 50.0, "max_position_embeddings": 8192,
          "torch_dtype": "bfloat16"}
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
         "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
         "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def plan(cfg: dict, release: str, card: str, *flags: str):
    settings = EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-memory-bytes", "8G", *flags]).settings()
    version = parse_version(release)
    return make_plan(geometry_from_config(cfg), settings, preset(card), ruleset_for(release),
                     MemoryInputs(vllm_version=version))


@pytest.mark.parametrize("cfg,release,card,flags,backend,block_size", [
    # FA4's head-256 kernel on SM 10.x pages by 128 tokens and FlashAttention asks for it (0.29+)
    (GEMMA3, "0.31.0", "b200", ("--attention-backend", "FLASH_ATTN"), "FLASH_ATTN", 128),
    (GEMMA3, "0.28.0", "b200", ("--attention-backend", "FLASH_ATTN"), "FLASH_ATTN", 16),
    (GEMMA3, "0.31.0", "h100", ("--attention-backend", "FLASH_ATTN"), "FLASH_ATTN", 16),
    # from 0.12 a multiple of a kernel block is accepted: FlashInfer serves --block-size 128 with
    # 64-token kernel blocks (the sliding layers start from 64, and page unification scales them back
    # to the full layers' 128-token page: same bytes per token)
    (GEMMA2, "0.29.0", "h100", ("--attention-backend", "FLASHINFER", "--block-size", "128"), "FLASHINFER", 128),
    # FlashInfer's TRTLLM-gen pages up to 1024 on SM 10.x for GQA (0.24+): the default backend keeps
    # --block-size 256 there (before, kvwatch moved to FlashAttention)
    (LLAMA, "0.29.0", "b200", ("--block-size", "256"), "FLASHINFER", 256),
])
def test_the_release_kernel_blocks_decide_backend_and_block(cfg: dict, release: str, card: str, flags: tuple,
                                                            backend: str, block_size: int) -> None:
    p = plan(cfg, release, card, *flags)
    assert (p.backend, p.block_size) == (backend, block_size)
    assert p.kv_cache_tokens > 0


def test_before_0_12_a_fixed_kernel_block_is_accepted_only_as_itself() -> None:
    # vLLM 0.11.2: supports_block_size compares a fixed size for equality; FlashAttention is [16, 32, 64]
    p = plan(LLAMA, "0.11.2", "h100", "--block-size", "128", "--attention-backend", "FLASHINFER")
    assert p.backend is None and "FLASHINFER" in p.backend_reasons
    assert "block_size not supported" in p.backend_reasons["FLASHINFER"]


@pytest.mark.parametrize("release,backend,context,sizes", [
    ("0.20.2", "FLASH_ATTN", {"hybrid_state_float32": True}, (16, 32, 64)),
    ("0.25.1", "FLASH_ATTN", {"hybrid_state_float32": True}, None),          # the NaN workaround is gone
    ("0.24.0", "FLASHINFER", {"capability": (10, 0)}, (16, 32, 64, 128, 256, 512, 1024)),
    ("0.24.0", "FLASHINFER", {"capability": (10, 0), "num_attention_heads": 8}, None),   # MHA: no TRTLLM pages
    ("0.23.0", "FLASHINFER", {"capability": (10, 0)}, None),
    ("0.31.0", "FLASH_ATTN", {"capability": (9, 0), "head_size": 512, "head_size_v": 512, "kv_cache_dtype": "fp8"},
     (64,)),
    ("0.31.0", "FLASH_ATTN", {"capability": (10, 0), "head_size": 256, "head_size_v": 256, "softcap": True}, None),
    ("0.31.0", "FLASH_ATTN", {"capability": (10, 0), "head_size": 256, "head_size_v": 256}, (128,)),
    # any quantized KV dtype sends FA4's head-256 kernel back to FA2, not only the fp8 names
    # (vLLM 0.31.0, vllm/v1/attention/backends/fa_utils.py:252 is_quantized_kv_cache)
    ("0.31.0", "FLASH_ATTN", {"capability": (10, 0), "head_size": 256, "head_size_v": 256,
                              "kv_cache_dtype": "int8_per_token_head"}, None),
    ("0.31.0", "FLASH_ATTN", {"capability": (10, 0), "head_size": 256, "head_size_v": 256,
                              "kv_cache_dtype": "fp8_per_token_head"}, None),
    ("0.31.0", "FLASH_ATTN", {"capability": (10, 0), "head_size": 256, "head_size_v": 256,
                              "kv_cache_dtype": "bfloat16"}, (128,)),
    ("0.17.1", "TRITON_MLA", {}, (MultipleOf(1),)),
])
def test_kernel_rows(release: str, backend: str, context: dict, sizes: tuple | None) -> None:
    from kvwatch.vllm_releases.cuda_kernel_blocks import KernelContext, kernel_block_sizes
    base = {"capability": (9, 0), "num_attention_heads": 32, "num_kv_heads": 8, "head_size": 128, "head_size_v": 128}
    assert kernel_block_sizes(backend, parse_version(release), KernelContext(**{**base, **context})) == sizes
