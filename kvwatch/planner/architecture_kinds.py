"""How kvwatch handles each architecture vLLM registers, from the generated table (pure).

kvwatch/vllm_releases/architectures.py lists, per release and architecture, the cache layer kinds
vLLM's model classes can build (scripts/gen_vllm_architectures.py reads them from the release).
Every architecture gets one of four verdicts, never a silent default:

- "planned": kvwatch plans every layer kind the architecture can build (kvwatch/planner/layers.py
  places them from config.json);
- "refused": vLLM refuses it before sizing a cache (architectures.refusals predicts the sentence);
- "unknown": it can build a layer kind kvwatch has no rule for, or the release does not register it;
  the plan is then marked unknown, naming what kvwatch could not classify (exit 0);
- "draft": a draft head vLLM builds only as a target's --speculative-config draft, never served alone,
  whose cache layers kvwatch plans with its target's (planner/draft_heads.py names the planner); a
  config.json of the draft alone is planned unknown, with that reason.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.planner.cross_attention import cross_attention_planned
from kvwatch.planner.deepseek_v4 import DEEPSEEK_V4_KINDS, NOT_PLANNED
from kvwatch.planner.dots3_note import DOTS3_KINDS
from kvwatch.planner.draft_heads import draft_reason, planned_with_target
from kvwatch.planner.glm5_next import GLM5_NEXT_KINDS, GLM5_NEXT_SPEC_CLASSES
from kvwatch.planner.inkling import INKLING_KINDS
from kvwatch.planner.mistral_large4 import LARGE4_KINDS, LARGE4_NOT_PLANNED
from kvwatch.planner.qwen4_exp import QWEN4_EXP_KINDS, QWEN4_EXP_SPEC_CLASSES
from kvwatch.planner.step5_sparse import STEP5_KINDS
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.architecture_entry import ArchitectureEntry
from kvwatch.vllm_releases.architectures import ARCHITECTURES

PLANNED, REFUSED, UNKNOWN, DRAFT = "planned", "refused", "unknown", "draft"

# The cache kinds kvwatch plans, by the class (or Mamba backend) vLLM builds them with.
PLANNED_KINDS: dict[str, str] = {
    "Attention": "full or sliding-window attention",
    "ChunkedLocalAttention": "chunked local attention",
    "EncoderOnlyAttention": "encoder-only attention (no cache)",
    "MLAAttention": "MLA latent", "MultiHeadLatentAttention": "MLA latent",
    "DeepseekV32IndexerCache": "sparse-attention indexer",
    # MiniMax-M3 (vLLM 0.33 and 0.34): a full K/V cache, and a key-only indexer's (planner/minimax_sparse.py)
    "MiniMaxM3SparseAttention": "MiniMax-M3 sparse attention", "MiniMaxM3IndexerCache": "MiniMax-M3 indexer",
    "MAMBA1": "Mamba state", "MAMBA2": "Mamba2 state", "SHORT_CONV": "short-convolution state",
    "GDN_ATTN": "gated delta net (or KDA) state", "LINEAR": "lightning attention state (planner/bailing_linear.py)", "KimiK3DeltaAttention": "Kimi delta attention state",
    "StaticSinkAttention": "full attention with static sink tokens (planner/static_sink.py)",
    "PrefillPrefixLMAttention": "full attention, non-causal prefill (planner/prefix_lm.py)",
    # Voxtral's causal audio encoder: pooled sliding-window caches (planner/voxtral_encoder.py)
    "WhisperCausalAttentionWithBlockPooling": "Voxtral's causal audio encoder (planner/voxtral_encoder.py)",
    # extract_hidden_states' hidden-state cache, beside a full-attention target (planner/hidden_states.py)
    "CacheOnlyAttentionLayer": "extract_hidden_states' hidden-state cache (planner/hidden_states.py)",
}
# Kinds kvwatch does not plan that vLLM builds only when config.json has the field (the file
# otherwise builds a planned kind): vLLM 0.32, model_executor/models/deepseek_v2.py:209 (rswa_window).
GATED_KINDS: dict[str, str] = {"RSWAAttention": "rswa_window"}
# Mamba-backend classes that redefine get_kv_cache_spec in a way kvwatch plans: MambaMixer2's prefill
# checkpoint block (RecurrentState.checkpoint_blocks), Kimi delta attention's float32 state, the Qwen
# gated delta net's prefill checkpoint from 0.33 (vllm_releases/gdn_checkpoint.py). Another class
# reshaping its spec is unknown.
KNOWN_SPEC_CLASSES = frozenset({"MambaMixer2", "KimiK3DeltaAttention", "QwenGatedDeltaNetAttention"}) \
    | GLM5_NEXT_SPEC_CLASSES | QWEN4_EXP_SPEC_CLASSES   # KDA and PLE prefill checkpoints (glm5_next.py, qwen4_exp.py)
# Multimodal wrappers whose language model is an architecture of the same release that the table
# does not list under the wrapper: its verdict is theirs. vLLM 0.34.0 (and 0.33.0):
# Step5ForConditionalGeneration is the Step3p7 frontend over the Step5 text model
# (models/step5/nvidia/vl.py:12-13), built by init_vllm_registered_model from text_config
# (model_executor/models/step3p7.py:70-75), a Step5Config (transformers_utils/configs/step5.py:211-219).
LANGUAGE_MODELS: dict[str, str] = {"Step5ForConditionalGeneration": "Step5ForCausalLM"}
PLANNED_KINDS.update(INKLING_KINDS)   # Inkling's own attention and conv-ring specs (planner/inkling.py)
PLANNED_KINDS.update(DEEPSEEK_V4_KINDS)   # DeepSeek-V4's five cache kinds (planner/deepseek_v4.py)
PLANNED_KINDS.update(STEP5_KINDS)   # Step5's CSA summary and tail ring (planner/step5_sparse.py)
PLANNED_KINDS.update(GLM5_NEXT_KINDS)   # GLM-5-Next's indexer keys and tail ring (planner/glm5_next.py)
PLANNED_KINDS.update(QWEN4_EXP_KINDS)   # Qwen4-Exp's QSA caches (planner/qwen4_exp.py)
PLANNED_KINDS.update(DOTS3_KINDS)   # Dots3's padded DSA latent (planner/dots3_note.py)
PLANNED_KINDS.update(LARGE4_KINDS)   # Mistral Large 4's indexer keys (planner/mistral_large4.py)
NOT_PLANNED = {**NOT_PLANNED, **LARGE4_NOT_PLANNED}
# Layers that hold no cache: a model of these alone (BERT-like encoders) gets no KV cache from vLLM,
# which kvwatch plans as 0 blocks (planner/no_kv_cache.py).
_NO_CACHE = frozenset({"EncoderOnlyAttention"})
# Fields that list a model's layer kinds: with one, a hybrid class may well hold attention layers only
# (Granite 4.0's dense variants are GraniteMoeHybridForCausalLM with every layer attention).
_LAYER_LISTS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "attn_layer_indices",
                "linear_attn_config", "full_attention_interval")
# Recurrent kinds: a config kvwatch plans with state layers must have one of these in vLLM's model.
_RECURRENT = frozenset({"MAMBA1", "MAMBA2", "SHORT_CONV", "GDN_ATTN", "KimiK3DeltaAttention", "LINEAR"})


@dataclass(frozen=True)
class Verdict:
    handling: str                 # PLANNED, REFUSED, UNKNOWN or DRAFT
    reason: str                   # one line for the plan ("" when planned)
    unclassified: tuple[str, ...] = ()   # the layer kinds kvwatch cannot classify


def table_release(version: str | None) -> str | None:
    """The table's release for a vLLM version: the same minor release; for None, the release planned
    when none is given (DEFAULT_RELEASE)."""
    if version is None:
        version = str(DEFAULT_RELEASE)
    minor = ".".join(version.split(".")[:2])
    return next((r for r in ARCHITECTURES if ".".join(r.split(".")[:2]) == minor), None)


def entry(architecture: str, release: str) -> ArchitectureEntry | None:
    return ARCHITECTURES.get(release, {}).get(architecture)


def verdict(architecture: str, release: str, config: Mapping[str, Any] | None = None,
            in_transformers: frozenset[str] = frozenset()) -> Verdict:
    """kvwatch's handling of one architecture for one release (config: its text config.json, which
    decides the gated kinds; None: the verdict for the architecture as the table has it)."""
    found = entry(architecture, release)
    if found is None:
        # registry.py inspect_model_cls: vLLM then tries its Transformers backend, when transformers
        # (or the checkpoint's own code) has the class, and refuses the model otherwise
        return Verdict(UNKNOWN, f"architecture {architecture}, which vLLM {release} does not register (it may "
                                f"still run it on its Transformers backend)")
    if found.group == "previously_supported":
        if architecture in in_transformers:   # transformers has the class: vLLM's Transformers backend runs
            return Verdict(PLANNED, "")       # it (architectures.refusals predicts its refusal of state layers)
        return Verdict(REFUSED, f"vLLM {release} no longer serves {architecture} (since v{found.last_release})")
    if "class_not_found" in found.features:
        return Verdict(UNKNOWN, f"{architecture}: its class {found.cls} was not found in {found.source}",
                       (found.cls,))
    kinds = tuple(k for k in found.kinds if not _gated_off(k, config))
    if (draft := draft_reason(architecture)) is not None:   # planner/draft_heads.py: a draft's own verdict
        if planner := planned_with_target(architecture):
            return Verdict(DRAFT, f"{architecture} (vLLM {release}, {found.source}): {draft}; a draft head, planned "
                                  f"with its target ({planner}): plan the target's config.json with that method")
        return Verdict(UNKNOWN, f"{architecture} (vLLM {release}, {found.source}): {draft}", kinds or (found.cls,))
    if not kinds and not delegates(found):
        return Verdict(UNKNOWN, f"{architecture} (vLLM {release}, {found.source}): no cache layer found in its "
                                f"source (a draft head or a non-language model): kvwatch cannot plan it",
                       (found.cls,))
    if _no_cache(found, kinds):   # planned as no KV cache (planner/no_kv_cache.py)
        return Verdict(PLANNED, "")
    language_model = LANGUAGE_MODELS.get(architecture)
    if language_model is not None and entry(language_model, release) is not None:
        inner = verdict(language_model, release, config, in_transformers)
        if inner.handling == UNKNOWN:
            return Verdict(UNKNOWN, f"{architecture} (vLLM {release}): its language model {inner.reason}",
                           inner.unclassified)
    if architecture in NOT_PLANNED:   # a planned layer class, built with caches of other shapes
        return Verdict(UNKNOWN, f"{architecture} (vLLM {release}, {found.source}): {NOT_PLANNED[architecture]}",
                       (architecture,))
    unclassified = tuple(k for k in kinds if k not in PLANNED_KINDS and not cross_attention_planned(k, architecture))
    unclassified += tuple(f"{c.split(':')[1]} (its own get_kv_cache_spec)" for c in found.spec_classes
                          if c.split(":")[1] not in KNOWN_SPEC_CLASSES)
    if unclassified:
        return Verdict(UNKNOWN, f"{architecture} (vLLM {release}, {found.source}) builds layers kvwatch has no "
                                f"rule for: {', '.join(unclassified)}", unclassified)
    return Verdict(PLANNED, "")


def _no_cache(found: ArchitectureEntry, kinds: tuple[str, ...]) -> bool:
    # a multimodal wrapper's encoder-only kinds are its vision tower's: its text_config decides
    return bool(kinds) and set(kinds) <= _NO_CACHE and not delegates(found)


def builds_no_cache(architectures: tuple[str, ...], version: str | None) -> str:
    """Why vLLM allocates no KV cache for this model (every layer it builds holds none), or ""."""
    release = table_release(version)
    if release is None or not architectures:
        return ""
    arch = next((a for a in architectures if entry(a, release) is not None), architectures[0])
    found = entry(arch, release)
    if found is None or found.group == "previously_supported" or not _no_cache(found, found.kinds):
        return ""
    return (f"{arch} (vLLM {release}, {found.source}) builds {', '.join(found.kinds)} layers only, "
            f"which hold no KV cache")


def _gated_off(kind: str, config: Mapping[str, Any] | None) -> bool:
    gate = GATED_KINDS.get(kind)
    return gate is not None and (config is None or config.get(gate) is None)


def delegates(found: ArchitectureEntry) -> bool:
    """A wrapper whose language model vLLM builds from text_config's own architecture."""
    return "delegates_to_language_model" in found.features or "multimodal" in found.features


def unknown_reasons(architectures: tuple[str, ...], config: Mapping[str, Any], has_state_layers: bool,
                    version: str | None, in_transformers: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Why a plan of this config.json must be marked unknown, from the table (empty: planned or refused)."""
    release = table_release(version)
    if release is None or not architectures:
        return ()
    # vLLM serves the first listed architecture it registers (registry.py inspect_model_cls); none: the first
    arch = next((a for a in architectures if entry(a, release) is not None), architectures[0])
    v = verdict(arch, release, config, in_transformers)
    if v.handling in (UNKNOWN, DRAFT):   # a draft alone is no model vLLM serves
        return (v.reason,)
    found = entry(arch, release)
    if v.handling == PLANNED and found is not None and not has_state_layers and "hybrid" in found.features \
            and not any(f in config for f in _LAYER_LISTS):
        return (f"{arch} is a hybrid in vLLM {release} (IsHybrid, {found.source}), but kvwatch placed no "
                f"recurrent-state layers: config.json lists none and kvwatch has no rule for this model type",)
    if v.handling == PLANNED and found is not None and has_state_layers and found.backend != "transformers" \
            and found.group != "previously_supported" and not delegates(found) \
            and not _RECURRENT & set(found.kinds):
        return (f"config.json places recurrent-state layers, but {arch} (vLLM {release}, {found.source}) "
                f"builds none",)
    return ()
