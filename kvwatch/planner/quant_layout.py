"""What a quantized checkpoint's linear layers weigh on the GPU, from its own quantization_config (pure).

Each scheme's bytes per weight are the tensors vLLM's `create_weights` allocates for it, less what its
`process_weights_after_loading` frees (vLLM 0.19.1, vllm/model_executor/layers/quantization/):
- AWQ (awq.py:207-240; awq_marlin.py:413-445, the same three tensors): qweight int32 packing 32/bits values,
  qzeros int32 (groups x out / pack) and scales in the model dtype (groups x out): bits/8 + (dtype + bits/8) / group.
  Marlin repacks to the same sizes (kernels/linear/mixed_precision/marlin.py:96-118) and keeps the zero points
  (:145-160, `zero_points` on for AWQ); its workspace is one int32 per SM (utils/marlin_utils.py:257-265), noise.
- GPTQ (gptq_marlin.py:401-435): qweight, g_idx, qzeros, scales. Marlin empties g_idx without `desc_act` and
  the zero points of a symmetric checkpoint (marlin.py:135-165); an asymmetric one keeps them. Cards below
  compute capability 8.0 run gptq.py instead, which keeps qzeros (gptq.py:325-353): counted as Marlin.
- FP8 (fp8.py:355-379): one byte a weight; with `weight_block_size` a float32 scale per block (weight_scale_inv).
- ModelOpt (modelopt.py:107-120 QUANT_ALGOS): FP8 and FP8_PER_CHANNEL_PER_TOKEN one byte (:483-502, :572-584);
  FP8_PB_WO a float32 scale per 128 x 128 block (:655-684); NVFP4 two values a byte plus an fp8 scale per
  `group_size` (16) values (:1113-1144); MXFP8 one byte plus a uint8 scale per 32 (:1594-1610,
  utils/mxfp8_utils.py:21-23); MIXED_PRECISION each layer by `quantized_layers` (:2053-2170), FP8 or NVFP4.
  Excluded: `exclude_modules` (hf_quant_config.json's form, its fields under "quantization": :285-296) or
  `ignore` (config.json's form: :313).
- compressed-tensors, per config group whose `targets` match the layer ("Linear" all of them, "re:" a regex
  from the name's start), its `ignore` list excluded: integer weights packed into int32 with group scales in the
  model dtype and int32 zero points when not symmetric (schemes/compressed_tensors_wNa16.py:127-198); 8-bit
  weights one byte (w8a8_fp8, w8a8_int8), a float32 scale per block for the "block" strategy; NVFP4
  (w4a4_nvfp4.py:50-80) two values a byte and an fp8 scale per 16; MXFP4/MXFP8 an 8-bit scale per 32.
- `--quantization mxfp8` on an unquantized checkpoint (mxfp8.py:56-82, online): one byte and a scale per 32.
- bitsandbytes: 8-bit one byte, 4-bit two values a byte and its block's absmax; the modules its
  `llm_int8_skip_modules` names stay in the model dtype (bitsandbytes.py:172-186 is_layer_skipped_bnb: a name
  equal to one of the layer prefix's components, or a leading run of its components; unsloth's dynamic 4-bit
  checkpoints list whole attention and MLP blocks of a few layers).
Per-tensor and per-channel scales (a few numbers per output row) are left out: under 0.1 % of a layer.
Layers a scheme excludes (_SKIP_KEYS) stay in the model dtype. The module names tested against a scheme's lists are the
Hugging Face ones a decoder's checkpoint holds (`model.layers.N.self_attn.q_proj`, `.mlp.experts.E.up_proj`,
`.mlp.gate` the router), each part's names weighted alike; MIXED_PRECISION looks each one up as vLLM resolves a
layer's prefix (_mixed_entry below).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

# bitsandbytes 4-bit: two values a byte, and the block's absmax (kvwatch's earlier figure, kept)
BNB_4BIT_RATE = 0.5 + 0.5 / 64

# The parts of a decoder's linear layers a scheme may treat apart, by the names of one layer's modules.
PART_MODULES: Mapping[str, tuple[str, ...]] = {
    "attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "experts": ("mlp.experts.0.gate_proj", "mlp.experts.0.up_proj", "mlp.experts.0.down_proj"),
    "router": ("mlp.gate",),
}

_FP8_BLOCK = 4           # float32 block scales
_MX_BLOCK = 32           # OCP MX: one 8-bit scale per 32 values (MXFP4, MXFP8)
_PB_WO_BLOCK = 128 * 128   # ModelOpt FP8_PB_WO's 128 x 128 blocks (modelopt.py:627-684)
# Layers whose names are matched one by one; a (hostile) config with more is taken at their mean.
_LAYERS_SCANNED = 1024
_DEFAULT_GROUP = 128     # a GPTQ/AWQ config without group_size (kvwatch's assumption, not vLLM's: it requires one)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _group(value: Any) -> int:
    return _positive(value) or _DEFAULT_GROUP


def _block_scale(block: Any) -> float:
    """Bytes per weight of float32 scales per [rows, columns] block (0 without a valid block)."""
    if isinstance(block, (list, tuple)) and len(block) == 2:
        rows, cols = _positive(block[0]), _positive(block[1])
        if rows and cols:
            return _FP8_BLOCK / (rows * cols)
    return 0.0


def awq_rate(bits: int, group: int, dtype_bytes: int) -> float:
    """AWQ: packed weights, a zero point (bits) and a scale (model dtype) per group of each output column."""
    return bits / 8 + (dtype_bytes + bits / 8) / group


def gptq_rate(bits: int, group: int, dtype_bytes: int, symmetric: bool) -> float:
    """GPTQ as Marlin keeps it: packed weights and group scales; the zero points only when asymmetric."""
    return bits / 8 + (dtype_bytes + (0 if symmetric else bits / 8)) / group


def modelopt_rate(algo: str, dtype_bytes: int, group: Any = None) -> float:
    """ModelOpt's quant_algo (upper-cased as vLLM does, modelopt.py:320)."""
    algo = algo.upper()
    if algo in ("NVFP4", "W4A16_NVFP4"):
        # W4A16_NVFP4 loads into the same NVFP4 sub-config and packing, only its activations stay 16-bit
        # (vLLM 0.33.0 quantization/modelopt.py:150-153 LINEAR_ALGOS, :1692-1698)
        return 0.5 + 1 / (_positive(group) or 16)
    if algo == "MXFP8":
        return 1 + 1 / _MX_BLOCK
    if algo == "FP8_PB_WO":
        return 1 + _FP8_BLOCK / _PB_WO_BLOCK
    if algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN"):
        return 1.0
    return float(dtype_bytes)


def compressed_tensors_rate(weights: Mapping[str, Any], dtype_bytes: int) -> float:
    """A compressed-tensors group's `weights` scheme: bits, type (int/float), strategy, group size."""
    bits = _positive(weights.get("num_bits"))
    if bits is None or bits >= 16:
        return float(dtype_bytes)
    strategy = weights.get("strategy", "group")
    is_float = weights.get("type") == "float"
    group = _positive(weights.get("group_size"))
    if is_float and bits == 4:
        # NVFP4 (tensor_group, 16, fp8 scales) or MXFP4 (group 32, uint8 scales): one byte a scale
        return 0.5 + 1 / (group or 16)
    if bits == 8 and strategy == "group" and group == _MX_BLOCK and is_float:
        return 1 + 1 / _MX_BLOCK   # MXFP8
    if strategy == "block":
        return bits / 8 + _block_scale(weights.get("block_structure"))
    if strategy == "group" and group:
        zeros = 0 if weights.get("symmetric", True) else bits / 8
        return bits / 8 + (dtype_bytes + zeros) / group
    return bits / 8


# The key each method reads its excluded modules from, and how vLLM 0.19.1 matches a module's name
# against them (quantization/utils/quant_utils.py:437-451 is_layer_skipped: a full name, or with
# skip_with_substr a substring): compressed-tensors `ignore`, a full name or a "re:" regex from the name's
# start (compressed_tensors/utils.py:153-165); ModelOpt `exclude_modules`/`ignore`, a full name, a substring
# or an fnmatch wildcard (modelopt.py:148-180); AWQ `modules_to_not_convert`, substrings (awq.py:95-105);
# FP8 `ignored_layers`, else `modules_to_not_convert`, full names (fp8.py:161-183). GPTQ reads none.
_SKIP_KEYS: Mapping[str, tuple[str, ...]] = {
    "compressed-tensors": ("ignore",), "modelopt": ("exclude_modules", "ignore"),
    "awq": ("modules_to_not_convert",), "awq_marlin": ("modules_to_not_convert",),
    "fp8": ("ignored_layers", "modules_to_not_convert"), "mxfp8": ("ignored_layers", "modules_to_not_convert"),
    "bitsandbytes": ("llm_int8_skip_modules",),
}
# vLLM's fused linear layers, as bitsandbytes' prefix match sees them (a shard's own name never matches)
_FUSED_PREFIX = ((r"\.(q|k|v)_proj$", ".qkv_proj"), (r"\.(gate|up)_proj$", ".gate_up_proj"))


def _flat(quantization: Mapping[str, Any]) -> Mapping[str, Any]:
    """ModelOpt's hf_quant_config.json form keeps its fields under "quantization" (modelopt.py:285-296)."""
    inner = quantization.get("quantization")
    return {**quantization, **inner} if isinstance(inner, Mapping) else quantization


def _skip_list(quantization: Mapping[str, Any]) -> list[str]:
    method = str(quantization.get("quant_method", "")).lower()
    for key in _SKIP_KEYS.get(method, ()):
        skipped = quantization.get(key)
        if isinstance(skipped, (list, tuple)) and skipped:
            return [m for m in skipped if isinstance(m, str)]
    return []


def _skipped(name: str, patterns: Sequence[str], method: str) -> bool:
    """Whether vLLM leaves this module unquantized under the method's exclusion list (_SKIP_KEYS)."""
    if method == "bitsandbytes":
        return _bnb_skipped(name, patterns)
    for pattern in patterns:
        if name == pattern:
            return True
        if method == "compressed-tensors":
            if pattern.startswith("re:") and _regex(pattern[3:], name):
                return True
        elif method == "modelopt":
            if pattern in name or fnmatchcase(name, pattern):
                return True
        elif method in ("awq", "awq_marlin") and pattern in name:
            return True
    return False


def _bnb_skipped(name: str, patterns: Sequence[str]) -> bool:
    """bitsandbytes' rule on vLLM's prefix of the module (vLLM 0.19.0
    model_executor/layers/quantization/bitsandbytes.py:172-186): a pattern equal to a component, or to a
    leading run of the components."""
    for fused, into in _FUSED_PREFIX:
        name = re.sub(fused, into, name)
    components = name.split(".")
    leading = {".".join(components[:i + 1]) for i in range(len(components))}
    return any(p in components or p in leading for p in patterns)


def _targets_match(targets: Any, name: str) -> bool:
    if not isinstance(targets, (list, tuple)) or not targets:
        return True   # a group that names no targets covers every linear layer
    return any(t == "Linear" or t == name or (t.startswith("re:") and _regex(t[3:], name))
               for t in targets if isinstance(t, str))


def _regex(pattern: str, name: str) -> bool:
    try:
        return re.match(pattern, name) is not None
    except re.error:
        return False


def _uniform_rate(quantization: Mapping[str, Any], dtype_bytes: int) -> float | None:
    """Bytes per weight of a scheme that quantizes every linear layer alike (None: a per-layer one)."""
    method = str(quantization.get("quant_method", "")).lower()
    bits = _positive(quantization.get("bits") or quantization.get("w_bit"))
    group = quantization.get("group_size") or quantization.get("q_group_size")
    if method == "awq" or method == "awq_marlin":
        return awq_rate(bits or 4, _group(group), dtype_bytes)
    if method in ("gptq", "gptq_marlin"):
        return gptq_rate(bits or 4, _group(group), dtype_bytes, quantization.get("sym", True) is not False)
    if method == "fp8":
        return 1 + _block_scale(quantization.get("weight_block_size"))
    if method == "mxfp8":
        return 1 + 1 / _MX_BLOCK
    if method == "bitsandbytes":
        return 1.0 if quantization.get("load_in_8bit") else BNB_4BIT_RATE
    if method == "modelopt" and str(quantization.get("quant_algo", "")).upper() != "MIXED_PRECISION":
        return modelopt_rate(str(quantization.get("quant_algo", "")), dtype_bytes, group)
    return None


def _layer_rate(quantization: Mapping[str, Any], name: str, dtype_bytes: int, uniform: float | None) -> float:
    method = str(quantization.get("quant_method", "")).lower()
    if _skipped(name, _skip_list(quantization), method):
        return float(dtype_bytes)
    if uniform is not None:
        return uniform
    if method == "compressed-tensors":
        groups = quantization.get("config_groups")
        for group in (groups.values() if isinstance(groups, Mapping) else ()):
            if isinstance(group, Mapping) and _targets_match(group.get("targets"), name):
                weights = group.get("weights")
                return compressed_tensors_rate(weights if isinstance(weights, Mapping) else {}, dtype_bytes)
        return float(dtype_bytes)
    layers = quantization.get("quantized_layers")   # ModelOpt MIXED_PRECISION
    if isinstance(layers, Mapping):
        entry = _mixed_entry(layers, name)
        if entry is not None:
            return modelopt_rate(str(entry.get("quant_algo", "")), dtype_bytes, entry.get("group_size"))
    return float(dtype_bytes)


# ModelOpt MIXED_PRECISION: vLLM resolves each layer's algorithm from its prefix (vLLM 0.33.0
# model_executor/layers/quantization/modelopt.py:1748-1825 _resolve_quant_algo): the prefix itself, then
# a packed module's shards, then any key below the prefix (routed experts listed one by one), the prefix
# also spelled as the other form of a multimodal checkpoint's decoder (`model.language_model.` for
# `language_model.model.`, :1827-1842); a layer found nowhere stays unquantized (:1876-1881). kvwatch names
# a module `model.layers.N.<module>`; it is looked up under each spelling of the decoder's layers, a routed
# expert (`mlp.experts.0.up_proj`) also as the fused-MoE layer vLLM builds (`mlp.experts`), a dense MLP
# projection also as a shared expert's, and a Gated DeltaNet layer's attention (no `self_attn`) as its
# `linear_attn` projections (qwen3_5.py:307-317: in_proj_qkvz packs in_proj_qkv and in_proj_z).
_LAYER_SPELLINGS = ("model.layers.", "model.language_model.layers.", "language_model.model.layers.")
_MIXED_ALTERNATIVES: Mapping[str, tuple[str, ...]] = {
    "self_attn.q_proj": ("linear_attn.in_proj_qkvz", "linear_attn.in_proj_qkv"),
    "self_attn.k_proj": ("linear_attn.in_proj_qkvz", "linear_attn.in_proj_qkv"),
    "self_attn.v_proj": ("linear_attn.in_proj_qkvz", "linear_attn.in_proj_z"),
    "self_attn.o_proj": ("linear_attn.out_proj",),
    "mlp.gate_proj": ("mlp.shared_expert.gate_proj", "mlp.shared_experts.gate_proj"),
    "mlp.up_proj": ("mlp.shared_expert.up_proj", "mlp.shared_experts.up_proj"),
    "mlp.down_proj": ("mlp.shared_expert.down_proj", "mlp.shared_experts.down_proj"),
}


def _mixed_candidates(name: str) -> list[str]:
    match = re.match(r"model\.layers\.(\d+)\.(.+)$", name)
    if not match:
        return [name]
    index, module = match.groups()
    modules = [module]
    expert = re.match(r"(mlp\.experts)\.\d+\.", module)
    if expert:
        modules.append(expert.group(1))
    modules += _MIXED_ALTERNATIVES.get(module, ())
    return [f"{spelling}{index}.{m}" for m in modules for spelling in _LAYER_SPELLINGS]


def _mixed_entry(layers: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The `quantized_layers` entry vLLM would resolve a module to (None: left unquantized)."""
    candidates = _mixed_candidates(name)
    for candidate in candidates:
        entry = layers.get(candidate)
        if isinstance(entry, Mapping):
            return entry
    for candidate in candidates:
        below = candidate + "."
        for key, entry in layers.items():
            if isinstance(key, str) and key.startswith(below) and isinstance(entry, Mapping):
                return entry
    return None


def part_rate(quantization: Mapping[str, Any], part: str, num_layers: int, dtype_bytes: int,
              prefix: str = "model.layers") -> float:
    """Mean bytes per weight of one part's modules over the decoder's layers under this scheme."""
    quantization = _flat(quantization)
    uniform = _uniform_rate(quantization, dtype_bytes)
    if uniform is not None and not _skip_list(quantization):
        return uniform
    layers = min(max(1, num_layers), _LAYERS_SCANNED)
    names = [f"{prefix}.{i}.{m}" for i in range(layers) for m in PART_MODULES[part]]
    return sum(_layer_rate(quantization, n, dtype_bytes, uniform) for n in names) / len(names)


def handled(quantization: Mapping[str, Any]) -> bool:
    """This module sizes the checkpoint's scheme (else planner/weights.py's bits-per-weight rule does)."""
    return str(quantization.get("quant_method", "")).lower() in _HANDLED


_HANDLED = ("awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "mxfp8", "modelopt", "compressed-tensors", "bitsandbytes")


def scheme_rate(quantization: Mapping[str, Any], dtype_bytes: int) -> float:
    """Bytes per weight of a quantized linear layer under the scheme, no layer excluded: a uniform
    scheme's, compressed-tensors' first group's, or MIXED_PRECISION's most common quant_algo."""
    quantization = _flat(quantization)
    uniform = _uniform_rate(quantization, dtype_bytes)
    if uniform is not None:
        return uniform
    groups = quantization.get("config_groups")
    for group in (groups.values() if isinstance(groups, Mapping) else ()):
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if isinstance(weights, Mapping) and _positive(weights.get("num_bits")):
            return compressed_tensors_rate(weights, dtype_bytes)
    layers = quantization.get("quantized_layers")
    if isinstance(layers, Mapping):
        algos = [str(e.get("quant_algo", "")) for e in layers.values() if isinstance(e, Mapping)]
        if algos:
            common = max(sorted(set(algos)), key=algos.count)
            return modelopt_rate(common, dtype_bytes)
    return float(dtype_bytes)


def module_rate(quantization: Mapping[str, Any], name: str, dtype_bytes: int) -> float:
    """Bytes per weight of one named linear module (`model.layers.3.self_attn.q_proj`) under the scheme."""
    quantization = _flat(quantization)
    return _layer_rate(quantization, name, dtype_bytes, _uniform_rate(quantization, dtype_bytes))
