"""An MTP draft's cache layers and weights, and the recurrent states speculative decoding adds (pure).

`--speculative-config '{"method": "mtp", "num_speculative_tokens": N}'` (or a family's own "*_mtp"
name, which vLLM renames to "mtp": planner/deepseek_v4.py `drafts_with_mtp`) loads the checkpoint's
MTP head as a draft model beside the target, in the same engine:

- the draft's layers: `num_nextn_predict_layers` decoder layers, named after the target's
  (`model.layers.{num_hidden_layers + i}`), each the target's own decoder layer class, so its
  attention is the target's kind with the target's shapes. vLLM 0.32.0
  model_executor/models/deepseek_mtp.py:106 and :151-162 (DeepseekV2DecoderLayer: MLA),
  glm4_moe_mtp.py:98 and :135-136 (Glm4MoeDecoderLayer), qwen3_next_mtp.py:63 and :90-95
  (Qwen3NextDecoderLayer with `layer_type="full_attention"`, one layer when the config names no
  count; 0.34.0 :71 and :98-103), qwen3_5_mtp.py (Qwen3.5: MTP_FAMILIES). config/speculative.py:679-694, :778-786 and :838-844 (0.34.0 :852,
  :947, :1026) map the target's config to these drafts. The layers are shared across the
  speculative steps (step i runs layer `i % num_nextn_predict_layers`: deepseek_mtp.py:217,
  glm4_moe_mtp.py:172), so N does not multiply them.
- their KV cache: the drafter finds the attention layers loading the draft added to the forward
  context (vLLM 0.32.0, v1/spec_decode/llm_base_proposer.py:1319-1339; 0.34.0
  v1/worker/gpu/spec_decode/speculator.py:286-305); the model runner's get_kv_cache_spec
  reads every attention layer of that context (v1/worker/gpu_model_runner.py:7146-7160), so the
  draft's layers get specs like the target's and join the same KV cache groups
  (v1/core/kv_cache_utils.py get_kv_cache_groups): one more latent per token for DeepSeek-V3, one more
  full-attention layer beside Qwen3-Next's gated delta nets (the groups' size follows).
- their weights: the draft's own decoder layers and its `eh_proj`/`fc` (2 hidden x hidden); an MTP
  draft shares the target's embedding and LM head with one pipeline stage
  (vLLM 0.32.0, llm_base_proposer.py:1466-1471 and :1545-1566).

Apart from MTP, any speculative decoding gives each Mamba-style layer `num_speculative_tokens` more
state blocks per request (vLLM 0.32.0, model_executor/layers/mamba/abstract.py:79-83:
`num_speculative_blocks`; counted in `MambaSpec.max_memory_usage_bytes`, v1/kv_cache_interface.py:1076-1082,
from vllm_releases/kv_layout.py MAMBA_SPECULATIVE_BLOCKS; in mode "all" MAMBA_ALL_SPECULATIVE_BLOCKS).

Not planned: other MTP families (their geometry stays the target's), an MTP draft under pipeline
stages (its layers sit on the last stage), DeepSeek-V4 (planner/deepseek_v4.py plans its own), and
every draft with a checkpoint or cache of its own (EAGLE heads, a draft model, extract_hidden_states'
hidden-state cache). A plan never leaves such a draft out silently: `unplanned_draft` names it, the plan
marks its figures unsure with that reason (Plan.unknown_layer_types: planner/scope.py, so no rule changes
the command) and carries `draft_warning`, a risk only (certain=False, no flag change).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, replace
from typing import Any, ClassVar, Protocol, TypeVar

from kvwatch.errors import ConfigError
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.config_keys import MAX_FIELD
from kvwatch.planner.deepseek_v4 import drafts_with_mtp
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.flag_change import NO_CHANGE
from kvwatch.planner.kv_groups import KvGroups
from kvwatch.planner.layers import FULL, MAMBA, LayerLayout
from kvwatch.planner.predicted_refusal import PredictedRefusal
from kvwatch.planner.weights import WeightCount, count_weights
from kvwatch.values.config_values import positive_int
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases.kv_layout import MAMBA_ALL_SPECULATIVE_BLOCKS, MAMBA_SPECULATIVE_BLOCKS


@dataclass(frozen=True)
class MtpFamily:
    name: str
    default_layers: int | None   # the MTP layers when config.json names none (None: vLLM needs the field)
    # The hidden-state projection (2 hidden x hidden) is an nn.Linear, unquantized and whole on every
    # tensor-parallel rank (counted as the MoE routers are), else a quantized linear split over the ranks.
    plain_projection: bool
    count_field: str = "num_nextn_predict_layers"   # the (text) config.json field that counts the layers
    dense: bool = False   # each draft layer's MLP is dense (intermediate_size) whatever the target's experts


# vLLM 0.32.0: deepseek_mtp.py:87 and glm4_moe_mtp.py:92 `eh_proj = nn.Linear(...)`; qwen3_next_mtp.py:79
# `fc = ColumnParallelLinear(...)` (quantized but for modelopt_fp4 checkpoints), one layer by default (:63).
# Qwen3.5 and Qwen3.5-MoE (the text config's model type): Qwen3_5MultiTokenPredictor builds
# `mtp_num_hidden_layers` (default 1) Qwen3_5DecoderLayer(layer_type="full_attention") and the same `fc`
# (vLLM 0.32.0 and 0.33.0 qwen3_5_mtp.py:82, :98-106, :119-124; 0.34.0 :84, :100-108, :121-126), picked
# for qwen3_5(_moe)(_text) with n_predict = mtp_num_hidden_layers (0.34.0 config/speculative.py:1104-1123).
# MiMo (MiMoForCausalLM, Qwen2's layers): MiMoMultiTokenPredictor builds config.num_nextn_predict_layers
# MiMoMultiTokenPredictorLayer, each a Qwen2DecoderLayer (the target's attention) and an
# `input_proj = nn.Linear(2 hidden, hidden)` (vLLM 0.32.0, 0.33.0 and 0.34.0 mimo_mtp.py:56-64, :97),
# picked for MiMoForCausalLM (0.34.0 config/speculative.py:893-902).
# ERNIE 4.5 MoE: ErnieMultiTokenPredictor builds config.num_nextn_predict_layers layers, each a
# LlamaDecoderLayer (the target's attention shapes, a dense MLP of intermediate_size) and an
# `mtp_linear_proj = nn.Linear(2 hidden, hidden)` (vLLM 0.32.0, 0.33.0 and 0.34.0 ernie_mtp.py:55-58, :92),
# picked for ernie4_5_moe (0.34.0 config/speculative.py:978-983).
_QWEN3_5 = MtpFamily("Qwen3.5", 1, False, "mtp_num_hidden_layers")
MTP_FAMILIES = {"deepseek_v3": MtpFamily("DeepSeek-V3", None, True), "glm4_moe": MtpFamily("GLM-4.5", None, True),
                "qwen3_next": MtpFamily("Qwen3-Next", 1, False),
                "qwen3_5_text": _QWEN3_5, "qwen3_5_moe_text": _QWEN3_5, "mimo": MtpFamily("MiMo", None, True),
                "ernie4_5_moe": MtpFamily("ERNIE 4.5", None, True, dense=True)}
# The fields that give a config routed experts (planner/weights.py count_weights).
EXPERT_FIELDS = frozenset({"n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"})


@dataclass(frozen=True)
class MtpDraft:
    layers: int                  # num_nextn_predict_layers: the draft's decoder layers
    weights: WeightCount | None  # their parameters (embedding and LM head shared with the target)


def mtp_draft(cfg: Mapping[str, Any], model_type: str) -> MtpDraft | None:
    """The MTP head a (text) config.json describes, for the families planned here; None otherwise."""
    family = MTP_FAMILIES.get(model_type)
    if family is None:
        return None
    layers = positive_int(cfg, family.count_field) if family.count_field in cfg \
        else family.default_layers
    if layers and layers > MAX_FIELD:   # geometry's bound on any count of config.json
        raise ConfigError(f"config.json: field {family.count_field!r} must be at most {MAX_FIELD}, got {layers}")
    if not layers:
        return None
    dense = {k: v for k, v in cfg.items() if k not in EXPERT_FIELDS} if family.dense else cfg
    return MtpDraft(layers, draft_weights(dense, layers, family.plain_projection))


def draft_weights(cfg: Mapping[str, Any], layers: int, plain_projection: bool,
                  projection_matrices: int | None = None) -> WeightCount | None:
    """The draft's parameters: `layers` decoder layers as the MTP head builds them (DeepSeek's and
    GLM's an MoE layer, Qwen3-Next's full attention), plus the hidden-state projection,
    `projection_matrices` hidden x hidden (2 per layer unless given; MtpFamily.plain_projection says how
    it is held); no embedding, no LM head."""
    draft_cfg = {**cfg, "num_hidden_layers": layers, "first_k_dense_replace": 0,
                 "layer_types": ["full_attention"] * layers, "tie_word_embeddings": True, "vocab_size": 0}
    count = count_weights(draft_cfg)
    if count is None:
        return None
    matrices = 2 * layers if projection_matrices is None else projection_matrices
    projection = matrices * count.hidden_size * count.hidden_size
    return replace(count, linear_params=count.linear_params + projection, embedding_params=0,
                   router_params=count.router_params + (projection if plain_projection else 0))


def with_draft_weights(target: WeightCount | None, draft: WeightCount | None) -> WeightCount | None:
    """The target's count with the draft's layers added (the parts a draft layer holds, and the LM
    heads of a draft that keeps its own: planner/packed_draft.py)."""
    if target is None or draft is None:
        return target
    return replace(target, linear_params=target.linear_params + draft.linear_params,
                   embedding_params=target.embedding_params + draft.embedding_params,
                   attention_params=target.attention_params + draft.attention_params,
                   expert_matrices=target.expert_matrices + draft.expert_matrices,
                   router_params=target.router_params + draft.router_params,
                   replicated_linear_params=target.replicated_linear_params + draft.replicated_linear_params)


def planned_draft_layers(draft: MtpDraft | None, settings: EngineSettings) -> int:
    """The MTP layers this command adds to the engine's cache (0: none planned)."""
    if draft is None or settings.pipeline_parallel_size > 1:
        return 0
    return draft.layers if drafts_with_mtp(settings.speculative_method, settings.num_speculative_tokens) else 0


class _Geometry(Protocol):
    """What the hook reads of planner/geometry.py's ModelGeometry (which imports this module)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def layout(self) -> LayerLayout: ...

    @property
    def weight_count(self) -> WeightCount | None: ...

    @property
    def mtp_draft(self) -> MtpDraft | None: ...


G = TypeVar("G", bound=_Geometry)


def with_mtp_draft(geometry: G, settings: EngineSettings) -> G:
    """The geometry (planner/geometry.py ModelGeometry) of the target and its MTP draft together,
    where this command drafts with MTP: the draft's layers appended as the target's full-attention
    (or MLA) layers, its weights added; the geometry unchanged otherwise."""
    layers = planned_draft_layers(geometry.mtp_draft, settings)
    if not layers:
        return geometry
    layout = geometry.layout
    attention = [i for i, kind in enumerate(layout.kinds) if kind == FULL]
    if not attention:
        return geometry
    template = attention[-1]   # the target's full-attention layer the draft layer is built like

    def extended(values: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return None if values is None else (*values, *[values[template]] * layers)

    kinds = (*layout.kinds, *[FULL] * layers)
    new_layout = replace(layout, kinds=kinds, head_sizes=extended(layout.head_sizes), kv_heads=extended(layout.kv_heads))
    weights = geometry.mtp_draft.weights if geometry.mtp_draft is not None else None
    return replace(geometry, layer_kinds=kinds, layout=new_layout,
                   weight_count=with_draft_weights(geometry.weight_count, weights))


def with_speculative_states(groups: KvGroups, num_speculative_tokens: int, version: VllmVersion | None,
                            mamba_cache_mode: str) -> KvGroups:
    """Each Mamba-style layer's spec with the state blocks speculative decoding adds per request, as the
    release counts them in this mamba_cache_mode (planner/scheduler.py)."""
    counted = MAMBA_ALL_SPECULATIVE_BLOCKS if mamba_cache_mode == "all" else MAMBA_SPECULATIVE_BLOCKS
    if num_speculative_tokens <= 0 or not counted.holds(version) or not any(s.layer_kind == MAMBA for s in groups.specs):
        return groups
    specs = tuple(replace(s, speculative_blocks=num_speculative_tokens) if s.layer_kind == MAMBA else s
                  for s in groups.specs)
    return replace(groups, specs=specs)


# Methods that load no draft model and add no cache layer: n-gram and suffix matching over the tokens
# (vLLM 0.34.0, vllm/config/speculative.py:91-97 and :1368-1369, "[ngram]" renamed to "ngram" at :1380-1381).
NO_DRAFT_METHODS = frozenset({"ngram", "[ngram]", "ngram_gpu", "suffix"})
# Why the draft of each other method kvwatch knows is not planned (vllm/config/speculative.py:84-97).
_NOT_PLANNED = {
    "eagle": "an EAGLE head: its own checkpoint and attention layers",
    "eagle3": "an EAGLE-3 head: its own checkpoint and attention layers",
    "dflash": "a DFlash draft: its own checkpoint and attention layers",
    "dspark": "a DSpark draft: its own checkpoint and layers",
    "draft_model": "a separate draft model: its own config.json and KV cache layers",
    "extract_hidden_states": "its hidden-state cache layer (planner/draft_heads.py ExtractHiddenStatesModel)",
}


def _is_mtp(method: str) -> bool:
    return method == "mtp" or method.endswith("_mtp")


def unplanned_draft(settings: EngineSettings, planned_layers: int, planned_families: str) -> str:
    """Why this command's draft is not in the plan ("": no draft, a method with no draft model, or a
    planned MTP draft of `planned_layers` layers). `planned_families`: which MTP heads the plan covers."""
    method = settings.speculative_method
    if not settings.speculative_config or method in NO_DRAFT_METHODS or planned_layers > 0:
        return ""
    if method is None:
        why = "no method given: vLLM detects it from the draft checkpoint (vllm/config/speculative.py:1349-1372)"
    elif not _is_mtp(method):
        why = _NOT_PLANNED.get(method, "a draft kvwatch does not plan")
    elif settings.num_speculative_tokens <= 0:
        why = "no num_speculative_tokens given: vLLM takes the MTP head's own count, which kvwatch does not plan"
    elif settings.pipeline_parallel_size > 1:
        why = "under pipeline parallelism the MTP layers sit on the last stage, which kvwatch does not plan"
    else:
        why = f"kvwatch plans the MTP heads of {planned_families} only"
    return (f"--speculative-config method {method or '(none)'!r}: the draft's KV cache and weights are not "
            f"counted in this plan ({why})")


def command_unplanned_draft(draft: MtpDraft | None, settings: EngineSettings) -> str:
    """unplanned_draft for a model planned here (not DeepSeek-V4, which planner/deepseek_v4.py plans)."""
    families = ", ".join(dict.fromkeys(f.name for f in MTP_FAMILIES.values()))
    return unplanned_draft(settings, planned_draft_layers(draft, settings), families)


def draft_warning(reason: str) -> tuple[PredictedRefusal, ...]:
    """The plan's warning of an unplanned draft: a risk (the cache holds fewer blocks, the weights take
    more than planned), never certain, with no flag change."""
    if not reason:
        return ()
    return (PredictedRefusal(FailureKind.KV_CACHE_TOO_SMALL, f"{reason}: the KV cache may hold fewer tokens than planned",
                             NO_CHANGE, certain=False),)
