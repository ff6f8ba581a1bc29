"""MTP draft heads (issues 38 and 39): their KV cache layers and weights are in the plan.

vLLM's own code is the oracle: scripts/oracle_mtp_draft.py builds each release's KV cache specs of a
target model plus its MTP draft's layers (DeepSeek-V3's MLA latent; Qwen3-Next's full-attention layer
beside its gated delta nets, whose Mamba specs carry num_speculative_tokens more states) and runs the
release's grouping, block sizing, concurrency and reported tokens on this CPU. Its answers for vLLM
0.32.0, 0.33.0 and 0.34.0 are recorded in tests/fixtures/mtp_draft_oracle.json, so kvwatch is checked
against them without the sources; where the unpacked releases are there
(KVWATCH_VLLM_SRC=<root>/<version>/vllm/...), the oracle is run again and must give the recorded
answers. Record them anew with `KVWATCH_VLLM_SRC=... python tests/test_mtp_draft.py`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.models.corpus import CORPUS
from vllm_sources import SpecOracle

from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.kv_groups import Demand, LayerSpec, kv_groups
from kvwatch.planner.layers import FULL, MAMBA
from kvwatch.planner.mtp_draft import mtp_draft, planned_draft_layers, with_speculative_states
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.planner.scheduler import mamba_cache_mode
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.gdn_checkpoint import GDN_CHECKPOINT_BLOCKS, GDN_PREFILL_CHECKPOINT

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "mtp_draft_oracle.json"
ORACLE = SpecOracle(ROOT / "scripts/oracle_mtp_draft.py", FIXTURE,
                    "scripts/oracle_mtp_draft.py on vLLM 0.32.0, 0.33.0 and 0.34.0's own kv_cache_interface.py, kv_cache_planning.py "
                    "and kv_cache_utils.py")
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
GiB = 1 << 30
# Real configs (tests/fixtures/models/corpus.py): DeepSeek-V3 with its published MTP head
# (num_nextn_predict_layers 1, which the shrunk copy set to 0), also at its published 61 layers;
# Qwen3-Next, whose config.json names no count (vLLM's default: one layer), also at its published 48;
# GLM-4.5-Air's config.json (zai-org/GLM-4.5-Air, as transformers 4.54.1's Glm4MoeConfig prints it).
GLM45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "model_type": "glm4_moe", "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8,
    "num_hidden_layers": 46, "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "pad_token_id": 151329,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.1", "use_cache": True, "use_qk_norm": False, "vocab_size": 151552,
}
# Qwen3.6-27B's config.json (Qwen3_5ForConditionalGeneration, model_type qwen3_5, transformers 4.57.1: 64
# layers, every 4th full attention, the rest gated delta nets, mtp_num_hidden_layers 1), as a public model
# report prints it; the vision tower (not in the KV cache) left out.
QWEN36_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": 248056, "language_model_only": False,
    "model_type": "qwen3_5", "tie_word_embeddings": False, "transformers_version": "4.57.1",
    "video_token_id": 248057, "vision_end_token_id": 248054, "vision_start_token_id": 248053,
    "text_config": {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": 248044,
        "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4, "head_dim": 256,
        "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17408,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144,
        "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 24, "num_hidden_layers": 64, "num_key_value_heads": 4, "output_gate_type": "swish",
        "pad_token_id": None, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": 248320},
}
# MiMo-7B's config.json (XiaomiMiMo/MiMo-7B-RL: MiMoForCausalLM, 36 Qwen2 layers, one MTP layer), as NVIDIA
# Megatron-Bridge's MiMo bridge test reproduces it.
MIMO_7B = {
    "architectures": ["MiMoForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
    "max_position_embeddings": 32768, "model_type": "mimo", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-05, "rope_theta": 640000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151680,
}
# ERNIE-4.5-300B-A47B's config.json as PaddlePaddle FastDeploy's model tests write it (shrunk to 5 layers;
# one MTP layer).
ERNIE45 = {
    "architectures": ["Ernie4_5_MoeForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "dtype": "bfloat16",
    "hidden_act": "silu", "hidden_size": 8192, "intermediate_size": 28672, "max_position_embeddings": 131072,
    "model_type": "ernie4_5_moe", "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 5,
    "pad_token_id": 0, "rms_norm_eps": 1e-05, "use_cache": False, "vocab_size": 103424, "rope_theta": 500000,
    "use_rmsnorm": True, "use_bias": False, "moe_num_experts": 64, "moe_layer_start_index": 1,
    "moe_intermediate_size": 3584, "moe_capacity": [64, 64, 64], "moe_gate": "topk", "moe_k": 4,
    "moe_layer_interval": 1, "moe_use_aux_free": True, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "is_quantized": False,
}
CONFIGS = {
    "deepseek_v3": {**CORPUS["deepseek_v3"]["config"], "num_nextn_predict_layers": 1},
    "deepseek_v3_61": {**CORPUS["deepseek_v3"]["config"], "num_nextn_predict_layers": 1, "num_hidden_layers": 61},
    "qwen3_next": CORPUS["qwen3_next"]["config"],
    "qwen3_next_48": {**CORPUS["qwen3_next"]["config"], "num_hidden_layers": 48},
    "glm45_air": GLM45_AIR,
    "qwen36_27b": QWEN36_27B,
    "mimo_7b": MIMO_7B,
    "ernie45": ERNIE45,
}


def _mtp(tokens: int) -> tuple[str, ...]:
    return ("--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": tokens}))


COMMON = ("--max-model-len", "32768", "--max-num-batched-tokens", "4096")
CASES: list[tuple[str, tuple[str, ...]]] = [
    ("deepseek_v3", (*COMMON, "--kv-cache-memory-bytes", str(8 * GiB), *_mtp(1))),
    ("deepseek_v3_61", (*COMMON, "--kv-cache-memory-bytes", str(40 * GiB), *_mtp(3))),
    ("deepseek_v3_61", (*COMMON, "--kv-cache-memory-bytes", str(40 * GiB))),
    ("qwen3_next", (*COMMON, "--kv-cache-memory-bytes", str(8 * GiB), *_mtp(2))),
    ("qwen3_next_48", (*COMMON, "--kv-cache-memory-bytes", str(20 * GiB), *_mtp(1))),
    ("qwen3_next_48", (*COMMON, "--kv-cache-memory-bytes", str(20 * GiB), *_mtp(3), "--no-enable-prefix-caching")),
    ("qwen3_next_48", (*COMMON, "--kv-cache-memory-bytes", str(20 * GiB))),
    ("glm45_air", (*COMMON, "--kv-cache-memory-bytes", str(30 * GiB), *_mtp(3))),
    ("qwen36_27b", (*COMMON, "--kv-cache-memory-bytes", str(20 * GiB), *_mtp(2))),
    ("qwen36_27b", (*COMMON, "--kv-cache-memory-bytes", str(20 * GiB), "--speculative-config",
                    '{"method": "qwen3_5_mtp", "num_speculative_tokens": 1}', "--no-enable-prefix-caching")),
    ("qwen36_27b", (*COMMON, "--kv-cache-memory-bytes", str(20 * GiB))),
    ("mimo_7b", (*COMMON, "--kv-cache-memory-bytes", str(10 * GiB), *_mtp(1))),
    ("mimo_7b", (*COMMON, "--kv-cache-memory-bytes", str(10 * GiB))),
    ("ernie45", (*COMMON, "--kv-cache-memory-bytes", str(4 * GiB), "--speculative-config",
                 '{"method": "ernie_mtp", "num_speculative_tokens": 1}')),
]


def _settings(flags: tuple[str, ...]) -> Any:
    return EngineCommand.parse(["vllm", "serve", "some/model", *flags]).settings()


def _plan(name: str, flags: tuple[str, ...], release: str) -> Plan:
    memory = MemoryInputs(vllm_version=parse_version(release))
    return make_plan(geometry_from_config(CONFIGS[name], release), _settings(flags), preset("h100"),
                     ruleset_for(release), memory)


def _oracle_case(name: str, flags: tuple[str, ...], release: str) -> dict[str, Any]:
    """The specs vLLM builds, from config.json as the models read it, at the plan's block size: MLA
    (one latent of kv_lora_rank + qk_rope_head_dim), or Qwen3-Next's attention (num_key_value_heads of
    head_dim) and gated delta net state (conv: (kernel - 1) x (2 key_dim + value_dim); temporal: value
    heads x key head dim x value head dim, model_executor/layers/mamba/mamba_utils.py
    gated_delta_net_state_shape), padded to the attention page."""
    plan, settings = _plan(name, flags, release), _settings(flags)
    geometry = geometry_from_config(CONFIGS[name], release)
    config = CONFIGS[name].get("text_config", CONFIGS[name])
    draft = planned_draft_layers(geometry.mtp_draft, settings)
    if config["model_type"] == "deepseek_v3":
        heads, head_size = 1, config["kv_lora_rank"] + config["qk_rope_head_dim"]
        layers, state, fp32_state, kinds = ["mla"] * config["num_hidden_layers"], 0, 0, ()
    elif config["model_type"] in ("glm4_moe", "mimo", "ernie4_5_moe"):
        heads = config["num_key_value_heads"]
        head_size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        layers, state, fp32_state, kinds = ["full"] * config["num_hidden_layers"], 0, 0, ()
    else:
        heads, head_size = config["num_key_value_heads"], config["head_dim"]
        kinds = geometry.layout.kinds
        layers = ["full" if k == FULL else "mamba" for k in kinds]
        key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
        value_dim = config["linear_num_value_heads"] * config["linear_value_head_dim"]
        state = (config["linear_conv_kernel_dim"] - 1) * (2 * key_dim + value_dim)
        temporal = config["linear_num_value_heads"] * config["linear_key_head_dim"] * config["linear_value_head_dim"]
        # Qwen3.5: the temporal state in config.json's mamba_ssm_dtype (vLLM 0.32.0 models/config.py:866)
        fp32 = config.get("mamba_ssm_dtype") == "float32"
        state, fp32_state = (state, temporal) if fp32 else (state + temporal, 0)
    mode = mamba_cache_mode(geometry, settings, parse_version(release)) if MAMBA in kinds else "none"
    # 0.33+: the gated delta nets export a prefill checkpoint in align mode on FlashInfer's GDN prefill,
    # which an H100 (9.0) runs (vllm_releases/gdn_checkpoint.py)
    checkpoints = GDN_CHECKPOINT_BLOCKS if state and mode == "align" and GDN_PREFILL_CHECKPOINT.holds(
        parse_version(release)) else 0
    return {"layers": layers, "draft_layers": draft, "heads": heads, "head_size": head_size,
            "block_size": plan.block_size, "mamba_block_size": plan.block_size if mode == "align" else plan.max_model_len,
            "state_elements": state, "state_fp32_elements": fp32_state, "state_page_padded": plan.page_size_bytes if state else None,
            "checkpoint_blocks": checkpoints,
            "num_speculative_tokens": settings.num_speculative_tokens, "mamba_cache_mode": mode,
            "max_model_len": plan.max_model_len, "max_num_batched_tokens": settings.max_num_batched_tokens,
            "memory": settings.kv_cache_memory_bytes}


@pytest.mark.parametrize("release", RELEASES)
def test_the_recorded_oracle_is_for_these_cases(release: str) -> None:
    recorded = ORACLE.recorded()
    assert recorded["cases"][release] == [_oracle_case(n, f, release) for n, f in CASES]
    assert len(recorded["answers"][release]) == len(CASES)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("index", range(len(CASES)))
def test_the_plan_with_an_mtp_draft_equals_vllms_own_sizing(release: str, index: int) -> None:
    """Groups, layers per group, bytes per block, blocks, blocks per request, concurrency and the
    logged tokens: vLLM's figures for the target's layers and the draft's together."""
    name, flags = CASES[index]
    answer = ORACLE.recorded()["answers"][release][index]
    plan = _plan(name, flags, release)
    assert plan.source == "exact"
    assert plan.kv_cache_groups == len(answer["groups"])
    assert plan.layers_per_block == max(g["layers"] for g in answer["groups"])
    assert (plan.bytes_per_block, plan.num_blocks) == (answer["bytes_per_block"], answer["num_blocks"])
    assert plan.blocks_per_request == sum(g["blocks_per_request"] for g in answer["groups"])
    assert plan.max_concurrency == answer["max_concurrency"]
    assert plan.kv_cache_tokens == answer["kv_cache_tokens"]


@pytest.mark.parametrize("release", RELEASES)
def test_the_oracle_gives_the_recorded_answers(release: str) -> None:
    ORACLE.check_live(release)


def test_the_recorded_figures_of_the_draft_layers() -> None:
    """DeepSeek-V3 (61 layers): the MTP layer is a 62nd latent in the one group, 1,152 B a token each
    (576 bf16 elements), so MTP costs 1/62 of the blocks. Qwen3-Next (48 layers: 12 attention, 36 gated
    delta nets): the draft's attention layer makes 13, so a group holds up to 13 layers (the 36 states
    in 3 groups of 12, each a padding slot short) where it held 12, and each block is 13/12 as large."""
    for release in RELEASES:
        answers, block = ORACLE.recorded()["answers"][release], ORACLE.recorded()["cases"][release][1]["block_size"]
        mtp, plain = answers[1], answers[2]
        assert [g["layers"] for g in mtp["groups"]] == [62] and [g["layers"] for g in plain["groups"]] == [61]
        assert (mtp["bytes_per_block"], plain["bytes_per_block"]) == (62 * 1152 * block, 61 * 1152 * block)
        hybrid, hybrid_plain = answers[4], answers[6]
        assert [g["layers"] for g in hybrid["groups"]] == [12, 12, 12, 13]
        assert [g["layers"] for g in hybrid_plain["groups"]] == [12, 12, 12, 12]
        assert hybrid["bytes_per_block"] * 12 == hybrid_plain["bytes_per_block"] * 13
        # Qwen3.6-27B (Qwen3.5: 16 attention, 48 gated delta nets): the draft's attention layer makes 17
        qwen35, qwen35_plain = answers[8], answers[10]
        assert [g["layers"] for g in qwen35["groups"]] == [16, 16, 16, 17]
        assert [g["layers"] for g in qwen35_plain["groups"]] == [16, 16, 16, 16]
        assert qwen35["bytes_per_block"] * 16 == qwen35_plain["bytes_per_block"] * 17
        # MiMo-7B: one more Qwen2 attention layer beside its 36 (8 KV heads of 128: 4 KiB a token each)
        mimo, mimo_plain = answers[11], answers[12]
        assert [g["layers"] for g in mimo["groups"]] == [37] and [g["layers"] for g in mimo_plain["groups"]] == [36]
        assert (mimo["bytes_per_block"], mimo_plain["bytes_per_block"]) == (37 * 4096 * block, 36 * 4096 * block)


def test_the_draft_layers_a_config_describes() -> None:
    """num_nextn_predict_layers (Qwen3.5: mtp_num_hidden_layers) where config.json names it; Qwen3-Next's
    and Qwen3.5's one layer where it does not;
    nothing for a family whose draft kvwatch does not plan, or a head of no layers."""
    assert mtp_draft(CONFIGS["deepseek_v3"], "deepseek_v3").layers == 1   # type: ignore[union-attr]
    assert mtp_draft({**CONFIGS["deepseek_v3"], "num_nextn_predict_layers": 0}, "deepseek_v3") is None
    assert mtp_draft(CONFIGS["qwen3_next"], "qwen3_next").layers == 1   # type: ignore[union-attr]
    assert mtp_draft({**CONFIGS["qwen3_next"], "num_nextn_predict_layers": 2}, "qwen3_next").layers == 2  # type: ignore[union-attr]
    assert mtp_draft(GLM45_AIR, "glm4_moe").layers == 1   # type: ignore[union-attr]
    text = QWEN36_27B["text_config"]
    assert mtp_draft(text, "qwen3_5_text").layers == 1   # type: ignore[union-attr,arg-type]
    assert mtp_draft({**text, "mtp_num_hidden_layers": 2}, "qwen3_5_moe_text").layers == 2  # type: ignore[union-attr,arg-type]
    no_field = {k: v for k, v in text.items() if k != "mtp_num_hidden_layers"}   # type: ignore[union-attr]
    assert mtp_draft(no_field, "qwen3_5_text").layers == 1   # type: ignore[union-attr]
    assert mtp_draft({"num_nextn_predict_layers": 1}, "longcat_flash") is None
    assert mtp_draft(MIMO_7B, "mimo").layers == 1   # type: ignore[union-attr]
    assert mtp_draft(ERNIE45, "ernie4_5_moe").layers == 1   # type: ignore[union-attr]


@pytest.mark.parametrize(("flags", "layers"), [
    ((), 0),
    (_mtp(2), 1),
    (("--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 1}'), 1),
    (("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'), 0),
    (("--speculative-config", '{"method": "mtp"}'), 0),   # no count given: vLLM takes n_predict; not planned
    ((*_mtp(1), "-pp", "2"), 0),                            # the draft's layers sit on the last stage
])
def test_which_commands_add_the_draft_layers(flags: tuple[str, ...], layers: int) -> None:
    geometry = geometry_from_config(CONFIGS["deepseek_v3"])
    assert planned_draft_layers(geometry.mtp_draft, _settings(flags)) == layers


def test_the_draft_weights_are_its_layers_without_embeddings() -> None:
    """One more MoE decoder layer (what a 5th layer adds to the 4-layer target) and its 2 hidden x hidden
    projection; the embedding and LM head are the target's (shared by the drafter)."""
    geometry = geometry_from_config(CONFIGS["deepseek_v3"])
    five = geometry_from_config({**CONFIGS["deepseek_v3"], "num_hidden_layers": 5})
    draft = geometry.mtp_draft
    assert draft is not None and draft.weights is not None
    assert geometry.weight_count is not None and five.weight_count is not None
    assert draft.weights.embedding_params == 0
    hidden = CONFIGS["deepseek_v3"]["hidden_size"]
    one_layer = five.weight_count.linear_params - geometry.weight_count.linear_params
    assert draft.weights.linear_params == one_layer + 2 * hidden * hidden
    assert draft.weights.expert_matrices == five.weight_count.expert_matrices - geometry.weight_count.expert_matrices
    # eh_proj is an nn.Linear: counted with the routers (model dtype, whole on every rank)
    routers = five.weight_count.router_params - geometry.weight_count.router_params
    assert draft.weights.router_params == routers + 2 * hidden * hidden
    plain = _plan("deepseek_v3", ("--max-model-len", "32768"), "0.32.0")
    drafted = _plan("deepseek_v3", ("--max-model-len", "32768", *_mtp(1)), "0.32.0")
    assert drafted.gpu_budget is not None and plain.gpu_budget is not None
    assert drafted.gpu_budget.weights_bytes > plain.gpu_budget.weights_bytes


def test_a_plan_without_speculative_decoding_leaves_the_mamba_states_alone() -> None:
    plain = _plan("qwen3_next", COMMON + ("--kv-cache-memory-bytes", str(8 * GiB)), "0.32.0")
    ngram = _plan("qwen3_next", COMMON + ("--kv-cache-memory-bytes", str(8 * GiB), "--speculative-config",
                                          '{"method": "ngram", "num_speculative_tokens": 3}'), "0.32.0")
    # ngram adds no layer, but each of the 3 state groups keeps 3 more states per request
    assert (ngram.kv_cache_groups, ngram.bytes_per_block) == (plain.kv_cache_groups, plain.bytes_per_block)
    assert ngram.blocks_per_request == plain.blocks_per_request + 3 * 3


@pytest.mark.parametrize(("release", "mode", "tokens", "state_blocks"), [
    ("0.14.1", "none", 2, 1),    # no speculative states counted before 0.15
    ("0.15.1", "none", 2, 3),    # 1 + N
    ("0.15.1", "align", 2, 4),   # 2 + N
    ("0.21.0", "all", 2, 4),     # cdiv(64, 16), no speculative ones in mode "all" yet
    ("0.22.1", "all", 2, 6),     # cdiv(64, 16) + N
    ("0.32.0", "align", 0, 2),   # no speculative decoding
])
def test_the_states_speculative_decoding_adds(release: str, mode: str, tokens: int, state_blocks: int) -> None:
    """MambaSpec.max_memory_usage_bytes per release and mode (vllm_releases/kv_layout.py
    MAMBA_SPECULATIVE_BLOCKS, MAMBA_ALL_SPECULATIVE_BLOCKS); attention layers are left alone."""
    groups = kv_groups([LayerSpec(FULL, 16, 4096, 4096), LayerSpec(MAMBA, 16, 4096, 3000)])
    out = with_speculative_states(groups, tokens, parse_version(release), mode)
    demand = Demand(max_model_len=64, max_in_flight_tokens=64, mamba_align=mode == "align", mamba_all=mode == "all")
    assert out.blocks_per_request(demand) == 4 + state_blocks   # 4 attention blocks of 16 tokens
    assert out.specs[0] == groups.specs[0]




def test_ernies_draft_layer_is_dense() -> None:
    """ERNIE 4.5's MTP layer is a LlamaDecoderLayer: the target's attention, a dense MLP of
    intermediate_size (no experts, no router), and its nn.Linear projection."""
    draft = mtp_draft(ERNIE45, "ernie4_5_moe")
    assert draft is not None and draft.weights is not None
    hidden, heads, kv_heads = ERNIE45["hidden_size"], ERNIE45["num_attention_heads"], ERNIE45["num_key_value_heads"]
    head = hidden // heads
    attention = 2 * hidden * heads * head + 2 * hidden * kv_heads * head
    assert draft.weights.expert_matrices == 0
    assert draft.weights.attention_params == attention
    projection = 2 * hidden * hidden
    assert draft.weights.linear_params == attention + 3 * hidden * ERNIE45["intermediate_size"] + projection
    assert draft.weights.router_params == projection


if __name__ == "__main__":   # record the oracle's answers (KVWATCH_VLLM_SRC must name the unpacked releases)
    ORACLE.record({r: [_oracle_case(n, f, r) for n, f in CASES] for r in RELEASES})
