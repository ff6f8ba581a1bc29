"""Weights from config.json: parameter counts of public models, tied embeddings, quantization."""
from __future__ import annotations

import pytest
from gpu_log_corpus import all_runs, model_config

from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.planner.weights import (
    bytes_of,
    count_model_weights,
    count_weights,
    gguf_bytes_per_param,
    gpu_weights_bytes,
    linear_bytes_per_param,
    mla_absorbed_bytes,
    mxfp4_expert_padding,
    mxfp4_triton_hopper_bytes,
    vision_tower_params,
    weights_bytes,
)
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.moe_kernels import mxfp4_expert_tiles

GiB = 2**30
LLAMA_3_1_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False}
QWEN_2_5_7B = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
               "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}
LLAMA_3_2_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True}


@pytest.mark.parametrize("cfg,published", [
    (LLAMA_3_1_8B, 8.03e9),    # meta-llama/Llama-3.1-8B model card: 8.03B
    (QWEN_2_5_7B, 7.61e9),     # Qwen/Qwen2.5-7B: 7.61B (biases of q/k/v left out: 0.1 M)
    (LLAMA_3_2_1B, 1.24e9),    # meta-llama/Llama-3.2-1B: 1.23B, embeddings tied
])
def test_parameter_counts_match_the_published_ones(cfg: dict, published: float) -> None:
    count = count_weights(cfg)
    assert count is not None and abs(count.params - published) / published < 0.005


def test_gqa_is_not_counted_as_full_attention() -> None:
    full = count_weights({**LLAMA_3_1_8B, "num_key_value_heads": 32})
    gqa = count_weights(LLAMA_3_1_8B)
    assert full is not None and gqa is not None
    assert full.linear_params - gqa.linear_params == 32 * 2 * 4096 * (32 - 8) * 128


def test_tied_embeddings_count_once() -> None:
    tied = count_weights(LLAMA_3_2_1B)
    untied = count_weights({**LLAMA_3_2_1B, "tie_word_embeddings": False})
    assert tied is not None and untied is not None
    assert untied.embedding_params == 2 * tied.embedding_params == 2 * 128256 * 2048


def test_quantization_shrinks_the_linear_layers_only() -> None:
    bf16 = weights_bytes(LLAMA_3_1_8B, 2)
    fp8 = weights_bytes({**LLAMA_3_1_8B, "quantization_config": {"quant_method": "fp8"}}, 2)
    awq = weights_bytes({**LLAMA_3_1_8B, "quantization_config": {"quant_method": "awq", "bits": 4,
                                                                  "group_size": 128}}, 2)
    assert bf16 is not None and fp8 is not None and awq is not None
    assert 14.9 * GiB < bf16 < 15.0 * GiB
    assert 8.4 * GiB < fp8 < 8.5 * GiB          # the FP8 8B checkpoints load as ~8.5 GiB
    assert 5.2 * GiB < awq < 5.4 * GiB
    assert linear_bytes_per_param({"quant_method": "bitsandbytes", "load_in_8bit": True}, 2) == 1.0
    assert linear_bytes_per_param(None, 2) == 2.0


def test_a_config_without_shapes_has_no_estimate() -> None:
    assert count_weights({"num_hidden_layers": 2}) is None


QWEN2_VL_7B = {**QWEN_2_5_7B, "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
                                               "hidden_size": 3584, "spatial_merge_size": 2}}


def test_a_vision_tower_counts_in_the_model_dtype() -> None:
    """Qwen2-VL-7B: 32 ViT blocks of 1280 wide (MLP ratio 4) and the 2x2 patch merger into 3584: ~0.67 B
    parameters, the 1.3 GiB a 7B VL checkpoint loads beyond its language model (15.51 vs 14.2 GiB)."""
    count = count_model_weights(QWEN2_VL_7B, QWEN2_VL_7B)
    text = count_weights(QWEN2_VL_7B)
    assert count is not None and text is not None
    assert count.vision_params == vision_tower_params(QWEN2_VL_7B)
    assert 0.66e9 < count.vision_params < 0.69e9
    quantized = {"quant_method": "awq", "bits": 4, "group_size": 128}
    # the vision tower stays in the model dtype when the language model is quantized
    assert gpu_weights_bytes(count, quantized, 2) - gpu_weights_bytes(text, quantized, 2) == count.vision_params * 2
    assert vision_tower_params(QWEN_2_5_7B) == 0


@pytest.mark.parametrize("name,per_param", [("Llama-3.2-3B-Instruct-Q8_0.gguf", 34 / 32),
                                            ("/models/qwen2.5-7b-instruct-q4_k_m.gguf", 144 / 256),
                                            ("model-F16.gguf", 2.0), ("model.gguf", None)])
def test_a_gguf_file_is_counted_in_the_type_its_name_carries(name: str, per_param: float | None) -> None:
    assert gguf_bytes_per_param(name) == per_param


def test_the_engine_quantization_flag_counts_like_a_checkpoint_config() -> None:
    count = count_weights(LLAMA_3_1_8B)
    assert count is not None
    bf16 = gpu_weights_bytes(count, None, 2)
    assert gpu_weights_bytes(count, None, 2, "fp8") == gpu_weights_bytes(count, {"quant_method": "fp8"}, 2) < bf16
    # GGUF: every tensor, embeddings included, in the file's type (Q8_0: 8.5 bits)
    assert gpu_weights_bytes(count, None, 2, "gguf", "m-Q8_0.gguf") == int(count.params * 34 / 32)
    # a checkpoint's own quantization_config wins over an online method
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128}
    assert gpu_weights_bytes(count, awq, 2, "fp8") == gpu_weights_bytes(count, awq, 2)


@pytest.mark.parametrize("scheme,per_param", [
    ({"num_bits": 8, "type": "float", "strategy": "channel"}, 1.0),           # FP8 dynamic: per-channel scales
    ({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}, 0.5 + 2 / 128),   # W4A16
    ({"num_bits": 4, "group_size": 128}, 0.5 + 2 / 128),                     # no strategy named: group
    ({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}, 0.5 + 1 / 16),  # NVFP4
])
def test_compressed_tensors_scales_follow_the_weight_scheme(scheme: dict, per_param: float) -> None:
    config = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": scheme}}}
    assert linear_bytes_per_param(config, 2) == pytest.approx(per_param)


def test_modelopt_nvfp4_is_four_bit_and_its_fp8_one_byte() -> None:
    assert linear_bytes_per_param({"quant_method": "modelopt", "quant_algo": "NVFP4"}, 2) == 0.5 + 1 / 16
    assert linear_bytes_per_param({"quant_method": "modelopt", "quant_algo": "FP8"}, 2) == 1.0


GPT_OSS_20B = {"hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
               "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
               "vocab_size": 201088}


def test_mxfp4_experts_carry_the_marlin_padding_below_hopper() -> None:
    """Marlin rounds each rank's expert intermediate size up to 128 and the hidden size to 256."""
    count = count_weights(GPT_OSS_20B)
    assert count is not None and count.expert_matrices == 24 * 32
    assert mxfp4_expert_padding(count, 1, (9, 0)) == 0 == mxfp4_expert_padding(count, 1, None)
    assert mxfp4_expert_padding(count, 1, (8, 0)) == 24 * 32 * 3 * (3072 * 2944 - 2880 * 2880)
    # TP 4: 720 per rank -> 768
    assert mxfp4_expert_padding(count, 4, (8, 0)) == 24 * 32 * 3 * (3072 * 768 * 4 - 2880 * 2880)
    mxfp4 = {"quant_method": "mxfp4"}
    a100 = gpu_weights_bytes(count, mxfp4, 2, tensor_parallel=1, capability=(8, 0))
    h100 = gpu_weights_bytes(count, mxfp4, 2, tensor_parallel=1, capability=(9, 0))
    assert a100 - h100 == int(mxfp4_expert_padding(count, 1, (8, 0)) * (0.5 + 1 / 32))


@pytest.mark.parametrize("capability,version,asked,tiles", [
    ((8, 0), (0, 10, 2), False, (128, 256)),     # Marlin below Hopper
    ((8, 9), (0, 31, 0), False, (128, 256)),
    ((9, 0), (0, 31, 0), False, None),           # Hopper: the Triton kernel (mxfp4_triton_hopper_bytes)
    ((9, 0), (0, 31, 0), True, (128, 256)),      # --moe-backend marlin
    ((10, 0), (0, 13, 0), False, (256, 256)),    # B200: FlashInfer TRT-LLM, 0.13's tiles
    ((10, 0), (0, 19, 0), False, (128, 256)),    # the oracle's from 0.19
    ((10, 3), (0, 33, 0), False, (128, 256)),    # B300: the SM100 family
    ((12, 0), (0, 31, 0), False, None),          # RTX 5090 / PRO 6000: not SM100
    (None, (0, 31, 0), False, None),
])
def test_mxfp4_experts_take_the_kernels_tiles(capability, version, asked, tiles) -> None:
    assert mxfp4_expert_tiles(capability, version, "marlin" if asked else None) == tiles


def test_trtllm_tiles_pad_gpt_oss_120b_at_tp8() -> None:
    """On a B200 at TP 8 each rank's 360-wide experts become 512 wide under 0.13's tiles, 384 from 0.19."""
    count = count_weights({**GPT_OSS_20B, "num_hidden_layers": 36, "num_local_experts": 128})
    assert count is not None
    experts = 36 * 128
    assert mxfp4_expert_padding(count, 8, (10, 0), version=(0, 13, 0)) == experts * 3 * (3072 * 512 * 8 - 2880 * 2880)
    assert mxfp4_expert_padding(count, 8, (10, 0), version=(0, 19, 0)) == experts * 3 * (3072 * 384 * 8 - 2880 * 2880)


def test_moe_backend_marlin_pads_mxfp4_experts_on_any_card() -> None:
    """`--moe-backend marlin` runs Marlin on a card whose default is another kernel: its padding then."""
    count = count_weights(GPT_OSS_20B)
    assert count is not None
    assert mxfp4_expert_padding(count, 1, (12, 0), moe_backend="marlin") == mxfp4_expert_padding(count, 1, (8, 0))
    mxfp4 = {"quant_method": "mxfp4"}
    asked = gpu_weights_bytes(count, mxfp4, 2, tensor_parallel=1, capability=(12, 0), moe_backend="marlin")
    default = gpu_weights_bytes(count, mxfp4, 2, tensor_parallel=1, capability=(12, 0))
    assert asked - default == int(mxfp4_expert_padding(count, 1, (8, 0)) * (0.5 + 1 / 32))
    assert gpu_weights_bytes(count, mxfp4, 2, tensor_parallel=1, capability=(12, 0), moe_backend="triton") == default


def _triton_hopper_extra(experts: int, layers: int, width: int, hidden: int, kept_scales: bool) -> int:
    """Per rank, written out tensor by tensor as vLLM 0.19.1 builds them (quantization/mxfp4.py
    create_weights; quantization/utils/mxfp4_utils.py _swizzle_mxfp4; triton_kernels hopper layouts)."""
    pad = -(-width // 64) * 64
    w13, w2 = experts * 2 * pad * hidden // 2, experts * hidden * pad // 2             # uint8 weights
    s13, s2 = experts * 2 * pad * hidden // 32, experts * hidden * pad // 32            # checkpoint-layout scales
    swizzled = experts * (-(-2 * pad // 256) * 256 * (hidden // 32) + -(-hidden // 256) * 256 * -(-(pad // 32) // 2) * 2)
    biases = experts * (2 * pad + hidden) * 4                                          # float32
    checkpoint = experts * 3 * hidden * width // 2 + experts * 3 * hidden * width // 32
    return layers * (w13 + w2 + (s13 + s2 if kept_scales else 0) + swizzled + biases - checkpoint)


@pytest.mark.parametrize(("tp", "capability", "version", "kept"), [
    (1, (9, 0), (0, 14, 1), True),     # H100, one GPU: no width padding, the scales twice
    (2, (9, 0), (0, 19, 0), True),     # TP 2: 1440 per rank -> 1472
    (1, (9, 0), (0, 25, 1), False),    # 0.25 frees the checkpoint-layout scales
])
def test_mxfp4_experts_on_hopper_carry_the_triton_backends_copies(tp: int, capability: tuple[int, int],
                                                                    version: tuple[int, int, int], kept: bool) -> None:
    count = count_weights(GPT_OSS_20B)
    assert count is not None
    expected = _triton_hopper_extra(32, 24, 2880 // tp, 2880, kept) * tp
    assert mxfp4_triton_hopper_bytes(count, tp, capability, version) == expected > 0


@pytest.mark.parametrize(("capability", "version"), [((8, 0), (0, 19, 0)), ((12, 0), (0, 19, 0)),
                                                     (None, (0, 19, 0))])
def test_mxfp4_experts_elsewhere_carry_no_triton_copies(capability: tuple[int, int] | None,
                                                        version: tuple[int, int, int]) -> None:
    """Marlin below Hopper (its padding is the checkpoint count's) and Blackwell's own backends."""
    count = count_weights(GPT_OSS_20B)
    assert count is not None
    assert mxfp4_triton_hopper_bytes(count, 1, capability, version) == 0


@pytest.mark.parametrize(("tp", "version"), [(1, (0, 10, 1)), (1, (0, 11, 2)), (4, (0, 11, 2))])
def test_mxfp4_experts_on_hopper_before_0_12_carry_the_marlin_padding(tp: int, version: tuple[int, int, int]) -> None:
    """Releases before 0.12 ship no triton_kernels: Hopper falls back to Marlin, which pads as below Hopper."""
    count = count_weights(GPT_OSS_20B)
    assert count is not None
    padding = mxfp4_expert_padding(count, tp, (8, 0))
    assert padding > 0
    assert mxfp4_triton_hopper_bytes(count, tp, (9, 0), version) == int(padding * (0.5 + 1 / 32))


PHI_1_5 = {"model_type": "phi", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32,
           "intermediate_size": 8192, "vocab_size": 51200, "tie_word_embeddings": False}


@pytest.mark.parametrize("cfg,published", [
    (PHI_1_5, 1.42e9),   # microsoft/phi-1_5 safetensors: 1.42B (fc1/fc2, no gate)
    ({**PHI_1_5, "hidden_size": 2560, "num_hidden_layers": 32, "intermediate_size": 10240}, 2.78e9),  # phi-2: 2.78B
    ({"model_type": "gpt_neox", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
      "intermediate_size": 8192, "vocab_size": 50304, "tie_word_embeddings": False}, 1.41e9),  # pythia-1.4b: 1.41B
    ({"model_type": "starcoder2", "hidden_size": 3072, "num_hidden_layers": 30, "num_attention_heads": 24,
      "num_key_value_heads": 2, "intermediate_size": 12288, "vocab_size": 49152,
      "tie_word_embeddings": True}, 3.03e9),  # bigcode/starcoder2-3b: 3.03B
    ({"model_type": "opt", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32, "ffn_dim": 8192,
      "vocab_size": 50272, "tie_word_embeddings": True}, 1.32e9),  # facebook/opt-1.3b: 1.32B (positions left out)
])
def test_a_two_matrix_mlp_counts_two_matrices(cfg: dict, published: float) -> None:
    count = count_weights(cfg)
    assert count is not None and abs(count.params - published) / published < 0.01
    assert count.mlp_matrices == 2


def test_phi_1_5_weighs_what_its_gtx_1080_start_up_logged() -> None:
    # tests/fixtures/gpu_logs search_phi15_gtx1080_v0641: "Loading model weights took 2.6419 GB" (float16)
    assert weights_bytes(PHI_1_5, 2) / GiB == pytest.approx(2.64, abs=0.01)
    gated = count_weights({**PHI_1_5, "model_type": "llama"})
    assert gated is not None and gated.mlp_matrices == 3


DEEPSEEK_R1 = {"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512,
               "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
               "vocab_size": 129280, "intermediate_size": 18432, "moe_intermediate_size": 2048,
               "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3}


@pytest.mark.parametrize(("cfg", "tp", "fp8", "version", "per_rank"), [
    # per layer and rank: W_QR 1536x16x64 bf16, W_Q_UK 1536x16x512 and W_UV_O 16x512x7168 in FP8, the
    # dequantized kv_b_proj 512x16x256 bf16; 61 layers
    (DEEPSEEK_R1, 8, True, (0, 7, 3), 61 * (1536 * 16 * 64 * 2 + 1536 * 16 * 512 + 16 * 512 * 7168 + 512 * 16 * 256 * 2)),
    (DEEPSEEK_R1, 8, True, (0, 7, 1), 61 * (1536 * 16 * 64 * 2 + 1536 * 16 * 512 + 16 * 512 * 7168 + 512 * 16 * 256 * 2)),
    (DEEPSEEK_R1, 8, True, (0, 8, 0), 0),   # no absorption flag from 0.8
    (DEEPSEEK_R1, 8, True, (0, 7, 0), 0),   # no MLA backend before 0.7.1
    # DeepSeek-V2-Lite in bf16 (no q_lora_rank: the q input is the hidden size), 27 layers, TP 1
    ({**DEEPSEEK_R1, "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16, "q_lora_rank": None},
     1, False, (0, 7, 2), 27 * (2048 * 16 * 64 * 2 + 2048 * 16 * 512 * 2 + 16 * 512 * 2048 * 2)),
    (LLAMA_3_1_8B, 1, False, (0, 7, 3), 0),
])
def test_v0_07_keeps_the_absorbed_mla_matrices_beside_the_weights(cfg: dict, tp: int, fp8: bool,
                                                                  version: tuple[int, int, int], per_rank: int) -> None:
    count = count_weights(cfg)
    assert count is not None
    assert mla_absorbed_bytes(count, tp, 2, fp8, version) == per_rank


QWEN3_NEXT_80B = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
                  "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
                  "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                  "linear_value_head_dim": 128, "num_experts": 512, "num_experts_per_tok": 10,
                  "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "intermediate_size": 5120,
                  "vocab_size": 151936, "tie_word_embeddings": False}


@pytest.mark.parametrize(("cfg", "mixers"), [
    # 12 gated attention layers: q and its output gate (2 x 16 x 256), k, v (2 x 2 x 256), o; 36 gated delta
    # nets: in_proj to 2 x 2048 + 2 x 4096 + 2 x 32, conv1d (2 x 2048 + 4096) x 4, out_proj, dt_bias and A_log
    (QWEN3_NEXT_80B, 12 * (2048 * 8192 + 2048 * 1024 + 4096 * 2048)
     + 36 * (2048 * 12352 + 8192 * 4 + 4096 * 2048 + 64)),
    ({**QWEN3_NEXT_80B, "attn_output_gate": False}, 12 * (2048 * 4096 + 2048 * 1024 + 4096 * 2048)
     + 36 * (2048 * 12352 + 8192 * 4 + 4096 * 2048 + 64)),
    ({**QWEN3_NEXT_80B, "layer_types": ["linear_attention"] * 47 + ["full_attention"]},
     (2048 * 8192 + 2048 * 1024 + 4096 * 2048) + 47 * (2048 * 12352 + 8192 * 4 + 4096 * 2048 + 64)),
    ({**QWEN3_NEXT_80B, "model_type": "qwen3_moe"}, 48 * (2 * 2048 * 4096 + 2 * 2048 * 512)),   # plain attention
])
def test_a_gated_delta_net_hybrid_counts_its_mixers_as_vllm_builds_them(cfg: dict, mixers: int) -> None:
    count = count_weights(cfg)
    assert count is not None and count.attention_params == mixers


def test_moe_routers_stay_in_the_model_dtype_under_quantization() -> None:
    """vLLM builds the routers without the checkpoint's quantization (WeightCount.router_params)."""
    moe = {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
           "head_dim": 128, "num_experts": 64, "num_experts_per_tok": 4, "moe_intermediate_size": 512,
           "vocab_size": 1000}
    count = count_weights(moe)
    assert count is not None and count.router_params == 4 * 2048 * 64
    fp8 = {"quant_method": "fp8"}
    plain = count.embedding_params + count.router_params
    assert gpu_weights_bytes(count, fp8, 2) == (count.linear_params - count.router_params) + plain * 2


@pytest.mark.parametrize("odd", [[], ["qwen3_next"], {"a": 1}, 3])
def test_a_model_type_that_is_no_string_is_read_as_no_family(odd: object) -> None:
    # found by test_hybrid_planner's property test: an unhashable model_type raised TypeError
    from kvwatch.planner.weights import count_model_weights
    cfg = {**GPT_OSS_20B, "model_type": odd, "num_local_experts": 0, "rope_scaling": {"rope_type": "yarn"}}
    count = count_model_weights(cfg, cfg)
    assert count is not None and count.params > 0


def test_llama4_counts_its_shared_expert_and_its_dense_layers_width() -> None:
    """Llama 4 builds a shared expert of the experts' width in every MoE layer and its dense layers at
    intermediate_size_mlp (vLLM 0.32.0 models/llama4.py:100-113, :344-356): Scout's 109 B and
    Maverick's 400 B total parameters as Meta publishes them (kvwatch counted Scout at 102.6 B before)."""
    scout = model_config(next(r for r in all_runs() if r["name"] == "llmdacc_llama4_scout_tp4_h100_v0190"))
    text = scout["text_config"]
    count = count_weights(text)
    assert count is not None and 107.5e9 < count.linear_params + count.embedding_params < 108.0e9
    maverick = {**text, "num_local_experts": 128, "interleave_moe_layer_step": 2,
                "moe_layers": list(range(1, 48, 2))}
    count = count_weights(maverick)
    assert count is not None and 399e9 < count.linear_params + count.embedding_params < 402e9


@pytest.mark.parametrize("card,moe_backend", [("a100-80g", None), ("b200", None), ("rtx-pro-6000", "marlin")])
def test_weight_files_carry_the_mxfp4_padding_config_json_does(card: str, moe_backend: str | None) -> None:
    """A plan from the checkpoint's files (their bytes, unpadded) and one from config.json's count give the
    card's kernel the same padded experts: the padding is the kernel's, whichever way the weights were read."""
    config = {**GPT_OSS_20B, "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
              "quantization_config": {"quant_method": "mxfp4"}, "torch_dtype": "bfloat16"}
    count = count_weights(config)
    assert count is not None
    checkpoint = bytes_of(count, config["quantization_config"], 2)   # what the files hold: no padding
    flags = ("--moe-backend", moe_backend) if moe_backend else ()
    settings = EngineCommand.parse(["vllm", "serve", "/m", "--max-model-len", "8192", *flags]).settings()
    version = parse_version("0.31.0")

    def weights(memory: MemoryInputs) -> int:
        plan = make_plan(geometry_from_config(config), settings, preset(card), ruleset_for("0.31.0"), memory)
        assert plan.gpu_budget is not None
        return plan.gpu_budget.weights_bytes

    from_config = weights(MemoryInputs(vllm_version=version))
    from_files = weights(MemoryInputs(vllm_version=version, weights_bytes=checkpoint))
    padding = mxfp4_expert_padding(count, 1, preset(card).compute_capability, moe_backend, version.parts)
    assert padding > 0
    assert from_files == from_config
    assert from_files - checkpoint >= int(padding * (0.5 + 1 / 32))
