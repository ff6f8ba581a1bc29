"""extract_hidden_states' hidden-state cache beside a target of full-attention layers only (pure).

`--speculative-config` method "extract_hidden_states" loads ExtractHiddenStatesModel, which builds one
CacheOnlyAttentionLayer storing the target's auxiliary hidden states: a HiddenStateCacheSpec (an
MLAAttentionSpec, vLLM 0.34.0 vllm/v1/kv_cache_interface.py:822-825) at the cache block size of
`len(eagle_aux_hidden_state_layer_ids)` heads of the target's hidden size, in the model dtype whatever
--kv-cache-dtype says (vllm/model_executor/models/extract_hidden_states.py:306-313, :331-357; 0.33.0 the
same lines). The layer ids come from the speculative config's `draft_model_config.hf_config` over the
target's config (v1/worker/gpu/spec_decode/extract_hidden_states_config.py:31-42); vLLM refuses the method
without them or with num_speculative_tokens other than 1 (spec_decode/extract_hidden_states.py:30-46).
Its backend, CACHE_ONLY_ATTN, takes any block size (the base class's MultipleOf(1),
v1/attention/backend.py:74-77), so the block size stays the target's.

Beside a target whose every layer is full attention the spec is of the same type: vLLM puts it in the
one UniformTypeKVCacheSpecs group (v1/core/kv_cache_planning.py:1188-1192), so a block grows by one page of
`block_size x layers x hidden_size x model dtype bytes` and a request needs no more blocks
(tests/hidden_state_oracle.py runs vLLM 0.33's and 0.34's grouping, num-blocks and capacity code on it).
Beside a hybrid target vLLM groups it apart and may scale every group's block to hold one token of it
(:1125-1156, :1192-1209): not planned here, its reason named.
"""
from __future__ import annotations

from dataclasses import replace

from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.kv_groups import KvGroups, LayerSpec
from kvwatch.planner.layers import FULL
from kvwatch.planner.mtp_draft import with_speculative_states
from kvwatch.values.versions import VllmVersion

METHOD = "extract_hidden_states"
CHECKED_MINORS = ((0, 33), (0, 34))   # the releases whose code tests/hidden_state_oracle.py ran


def hidden_state_page(block_size: int, aux_layers: int, hidden_size: int, model_bytes: int) -> int:
    """One block of the hidden-state cache: block_size tokens of aux_layers x hidden_size model-dtype values."""
    return block_size * aux_layers * hidden_size * model_bytes


def unplanned_reason(groups: KvGroups, settings: EngineSettings, hidden_size: int | None,
                     version: VllmVersion | None, mla: bool = False) -> str:
    """Why the hidden-state cache of this command is not planned ("": it is). `mla`: the target keeps MLA
    latents, beside which vLLM's grouping of it was not checked."""
    why = [reason for hit, reason in (
        (version is not None and version.parts[:2] not in CHECKED_MINORS,
         f"vLLM {version}: only 0.33's and 0.34's grouping of it is checked"),
        (not settings.speculative_aux_layers, "no draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids "
                                              "(vLLM refuses the method without them)"),
        (settings.num_speculative_tokens != 1, "num_speculative_tokens not 1 (vLLM requires 1)"),
        (settings.pipeline_parallel_size > 1, "pipeline parallelism"),
        (hidden_size is None, "no hidden_size in config.json"),
        (mla, "an MLA target (only K/V attention targets are checked)"),
        (len(groups.groups) != 1 or any(s.layer_kind != FULL for s in groups.specs),
         "a target with layers other than full attention: vLLM groups the hidden-state cache apart and may "
         "scale every group's block (v1/core/kv_cache_planning.py:1125-1156, :1192-1209)"),
    ) if hit]
    if not why:
        return ""
    return (f"--speculative-config method {METHOD!r}: the draft's KV cache and weights are not counted in this "
            f"plan (its hidden-state cache: {'; '.join(why)})")


def with_hidden_state_cache(groups: KvGroups, settings: EngineSettings, hidden_size: int | None, model_bytes: int,
                            version: VllmVersion | None, mla: bool = False) -> tuple[KvGroups, str]:
    """The target's one group with the hidden-state page added, and "" (planned); else the groups unchanged
    and why not."""
    reason = unplanned_reason(groups, settings, hidden_size, version, mla)
    if reason or hidden_size is None:
        return groups, reason
    block = groups.specs[0].block_size
    page = hidden_state_page(block, settings.speculative_aux_layers, hidden_size, model_bytes)
    specs = (*groups.specs, LayerSpec(FULL, block, page, page))
    members = (*groups.groups[0], len(groups.specs))
    return replace(groups, specs=specs, groups=(members,), group_size=len(members)), ""


def with_draft_caches(groups: KvGroups, settings: EngineSettings, hidden_size: int | None, model_bytes: int,
                      version: VllmVersion | None, mamba_mode: str, mla: bool = False) -> tuple[KvGroups, str | None]:
    """The groups with a draft's speculative states (planner/mtp_draft.py) and extract_hidden_states' cache,
    and, for that method, why its cache is not planned ("": it is; None: another method or none)."""
    groups = with_speculative_states(groups, settings.num_speculative_tokens, version, mamba_mode)
    if settings.speculative_method != METHOD:
        return groups, None
    return with_hidden_state_cache(groups, settings, hidden_size, model_bytes, version, mla)
