"""vLLM 0.33's gated delta net prefill checkpoint (vllm_releases/gdn_checkpoint.py), as tables.

vLLM's own code answers the same inputs in tests/test_release_oracles.py (checks gdn_checkpoint and
hybrid_block_size); here the rule, the hybrid alignment it implies and the plans it changes.
"""
from __future__ import annotations

import pytest

from kvwatch.planner.architecture_kinds import PLANNED, unknown_reasons, verdict
from kvwatch.planner.devices import Device, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.kv_groups import hybrid_block_size
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.gdn_checkpoint import gdn_checkpoint_alignment
from kvwatch.vllm_releases.hybrid_alignment import hybrid_alignment_for

V32, V33 = parse_version("0.32.0"), parse_version("0.33.0")


@pytest.mark.parametrize("version,platform,capability,head_k_dim,align,asked,expected", [
    (V33, "cuda", (9, 0), 128, True, None, 64),           # Hopper: FlashInfer's GDN prefill, any head width
    (V33, "cuda", (9, 0), 256, True, None, 64),
    (V33, "cuda", (9, 0), 128, True, "flashinfer", 64),
    (V33, "cuda", (9, 0), 128, True, "triton", None),     # another prefill backend asked for: no checkpoint
    (V33, "cuda", (10, 0), 128, True, None, 64),          # Blackwell: key heads of 128 only
    (V33, "cuda", (10, 0), 256, True, None, None),
    (V33, "cuda", (10, 0), 128, True, "cutedsl", None),
    (V33, "cuda", (12, 0), 128, True, None, 64),
    (V33, "cuda", (8, 0), 128, True, None, None),         # Ampere: Triton
    (V33, "cuda", (8, 9), 128, True, None, None),
    (V33, "cuda", (9, 0), 128, False, None, None),        # prefix caching off: no align mode
    (V33, "cpu", None, 128, True, None, None),            # the CPU never runs FlashInfer
    (V32, "cuda", (9, 0), 128, True, None, None),         # 0.32's layer keeps MambaBase's spec
    (None, "cuda", (9, 0), 128, True, None, 64),          # None: the newest release kvwatch knows
])
def test_which_gdn_layers_export_a_prefill_checkpoint(version, platform, capability, head_k_dim, align, asked,
                                                      expected) -> None:
    assert gdn_checkpoint_alignment(version, platform, capability, head_k_dim, align, asked) == expected


# Qwen3-Next: attention 2 KV heads of 256 in bf16 (2,048 B per token), a GDN state of 1,114,112 B
QWEN3_NEXT_PAGE, QWEN3_NEXT_STATE = 2_048, 1_114_112


@pytest.mark.parametrize("release,backend,block,checkpoint,expected", [
    ("0.32.0", "FLASH_ATTN", 16, 64, 544),     # 0.32 ignores the checkpoint: 16 x ceil(state / (16 x page))
    ("0.33.0", "FLASH_ATTN", 16, None, 544),
    ("0.33.0", "FLASH_ATTN", 16, 64, 576),     # lcm(16, 64) = 64: 64 x ceil(state / (64 x page))
    ("0.33.0", "FLASHINFER", 32, 64, 576),
    ("0.33.0", "FLASH_ATTN", 96, 64, 576),     # lcm(96, 64) = 192
])
def test_033_aligns_a_hybrid_block_to_the_gdn_checkpoint(release, backend, block, checkpoint, expected) -> None:
    rule = ruleset_for(release).backend(backend)
    assert rule is not None
    assert hybrid_block_size(hybrid_alignment_for(release), rule, block, QWEN3_NEXT_PAGE, QWEN3_NEXT_STATE,
                             False, checkpoint) == expected


QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "full_attention_interval": 4,
    "head_dim": 256, "hidden_size": 2048, "intermediate_size": 5120, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_value_head_dim": 128, "max_position_embeddings": 262144, "moe_intermediate_size": 512,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "partial_rotary_factor": 0.25, "shared_expert_intermediate_size": 512,
    "torch_dtype": "bfloat16", "vocab_size": 151936,
}
CPU = Device("cpu", "cpu", cpu_avx512_bf16=False)


def _plan(release: str, device: Device, *flags: str):
    settings = EngineCommand.parse(["vllm", "serve", "m", "--max-model-len", "32768", *flags], release).settings()
    memory = MemoryInputs(cpu_kv_space_bytes=64 * 2**30, vllm_version=parse_version(release))
    return make_plan(geometry_from_config(QWEN3_NEXT, release), settings, device, ruleset_for(release), memory)


@pytest.mark.parametrize("device,flags,block_032,block_033", [
    (preset("h100"), (), 544, 576),
    (preset("b200"), (), 544, 576),
    (preset("a100-80g"), (), 544, 544),                          # Triton's prefill: nothing changes
    (preset("h100"), ("--gdn-prefill-backend", "triton"), 544, 544),
    (preset("h100"), ("--no-enable-prefix-caching",), 544, 544),  # no align mode
    # 0.33 reads the backend from additional_config (qwen_gdn_linear_attn.py:175-181), the flag overwriting it
    (preset("h100"), ("--additional-config", '{"gdn_prefill_backend": "triton"}'), 544, 544),
    (preset("h100"), ("--additional-config", '{"gdn_prefill_backend": " Triton "}'), 544, 544),
    (preset("h100"), ("--additional-config", '{"gdn_prefill_backend": null}'), 544, 544),     # "none": Triton
    (preset("h100"), ("--additional-config", '{"gdn_prefill_backend": "FlashInfer"}'), 544, 576),
    (preset("h100"), ("--additional-config", '{"other_key": 1}'), 544, 576),                # "auto"
    (preset("h100"), ("--additional-config={\"gdn_prefill_backend\": \"triton\"}",), 544, 544),
    (preset("h100"), ("--additional-config", '{"gdn_prefill_backend": "triton"}',
                      "--gdn-prefill-backend", "flashinfer"), 544, 576),                 # the flag wins
    (preset("h100"), ("--gdn-prefill-backend", "triton",
                      "--additional-config", '{"gdn_prefill_backend": "flashinfer"}'), 544, 544),
])
def test_qwen3_next_block_size_on_032_and_033(device, flags, block_032, block_033) -> None:
    assert (_plan("0.32.0", device, *flags).block_size, _plan("0.33.0", device, *flags).block_size) == \
        (block_032, block_033)


def test_033_gives_a_qwen3_next_request_one_more_state_block_on_hopper() -> None:
    """In align mode a state layer holds 2 blocks per request; 0.33's checkpoint adds one per state group."""
    before, after = _plan("0.32.0", preset("h100")), _plan("0.33.0", preset("h100"))
    groups = after.kv_cache_groups
    assert groups == before.kv_cache_groups == 4   # 36 GDN layers in 3 groups of 12 beside 12 full ones
    state_groups = 3
    full_before = before.blocks_per_request - state_groups * 2
    full_after = after.blocks_per_request - state_groups * 3
    assert full_before == -(-32768 // 544) and full_after == -(-32768 // 576)


def test_033_plans_the_qwen_gdn_architectures_it_used_to_mark_unknown() -> None:
    for arch in ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                 "Qwen3_5ForConditionalGeneration"):
        assert verdict(arch, "0.33.0").handling == PLANNED, arch
    assert unknown_reasons(("Qwen3NextForCausalLM",), QWEN3_NEXT, True, "0.33.0") == ()
    # Qwen4Exp's PLE layer reshapes its spec too: planner/qwen4_exp.py plans it (unsure off vLLM 0.34)
    assert verdict("Qwen4ExpForCausalLM", "0.33.0").handling == PLANNED


def test_on_the_cpu_033_plans_qwen3_next_as_032() -> None:
    before, after = _plan("0.32.0", CPU), _plan("0.33.0", CPU)
    assert (before.block_size, before.num_blocks, before.blocks_per_request) == \
        (after.block_size, after.num_blocks, after.blocks_per_request)


@pytest.mark.parametrize("value,complaint", [
    ('{"gdn_prefill_backend": triton}', "argument --additional-config: invalid union_dict_and_str value: "
                                        "'{\"gdn_prefill_backend\": triton}' is not valid JSON (Expecting value"),
    ('{"gdn_prefill_backend": "triton",}', "is not valid JSON"),
    ('{"gdn_prefill_backend": "triton"', "--additional-config '{\"gdn_prefill_backend\": \"triton\"': expected a "
                                         "JSON object"),     # out of braces: a string, which VllmConfig refuses
    ("gdn_prefill_backend=triton", "expected a JSON object"),
    ("", "expected a JSON object"),
])
def test_a_malformed_additional_config_is_one_clear_error(value, complaint) -> None:
    from kvwatch.errors import CommandError
    with pytest.raises(CommandError) as refused:
        EngineCommand.parse(["vllm", "serve", "m", "--additional-config", value], "0.33.0").settings()
    assert complaint in str(refused.value) and "\n" not in str(refused.value)
