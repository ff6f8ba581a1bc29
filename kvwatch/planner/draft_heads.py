"""Speculative-decoding drafts kvwatch gives a verdict of their own, with the reason (pure).

A draft architecture is loaded next to the target through --speculative-config; whatever cache
layers it builds join the target's KV cache. vLLM never serves one alone. Eight are planned with their
target (`planned_with`: their verdict is architecture_kinds' DRAFT, "a draft head, planned with its
target"):

- Step5MTP: planner/step5_sparse.py adds its num_nextn_predict_layers Step5 decoder layers to the
  target's when the command drafts with mtp;
- Dots3NoteMTPModel: planner/dots3_note.py adds its sliding or DSA MLA layers (each DSA one with its
  indexer keys), and the tokens a multi-module draft keeps in every sliding window;
- Qwen4ExpMTP: planner/qwen4_exp.py adds its QSA layers, and the wider GDN and PLE states and QSA
  rings the speculative tokens make;
- Glm5NextMTPModel: planner/glm5_next.py adds its MLA layers, and the wider KDA states and tail rings
  the speculative tokens make;
- DSparkDraftModel and DSparkV41DraftModel, DeepSeek-V4's and V4.1's DSpark drafts (method dspark):
  planner/deepseek_v4.py and deepseek_v41.py add their sliding-only layers (and V4.1's wider
  compressor rings);
- MistralLarge4DSparkModel, Mistral Large 4's DSpark draft (method dspark, vLLM 0.34 only):
  planner/mistral_large4.py adds its dense MLA latents to the target's one group;
- ExtractHiddenStatesModel (method "extract_hidden_states"): planner/hidden_states.py adds its one
  CacheOnlyAttentionLayer, a HiddenStateCacheSpec (an MLAAttentionSpec, vllm/v1/kv_cache_interface.py:822-825)
  of len(eagle_aux_hidden_state_layer_ids) heads of the target's hidden size in the model dtype
  (vllm/model_executor/models/extract_hidden_states.py:306-313, :331-357; 0.33.0 the same lines), to a
  full-attention target's one group; beside a hybrid target, which vLLM groups apart
  (v1/core/kv_cache_planning.py:1125-1156, :1192-1209), the plan names it unplanned.

One draft of vLLM 0.33's and 0.34's builds no cache at all: ParseAuxMTPModel, Nemotron Parse 3.5's
one-step auxiliary MTP proposer: an embedding and two linear projections over the target's hidden
state, then the tied LM head (vLLM 0.34.0, vllm/model_executor/models/nemotron_parse3_5_mtp.py:16-55;
0.33.0 the same lines). vLLM picks it for a RadioMBartPrefixForCausalLM checkpoint with
`causal_vision_prefix` (vllm/config/speculative.py:810-820), so it adds nothing to the target's cache.
"""
from __future__ import annotations

from typing import NamedTuple


class DraftVerdict(NamedTuple):
    builds_cache: bool   # whether the draft adds a cache layer to the target's KV cache
    reason: str
    planned_with: str = ""   # the planner module that plans its cache layers with its target's ("": none)


DRAFTS: dict[str, DraftVerdict] = {
    "ParseAuxMTPModel": DraftVerdict(
        False, "a draft head with no cache layer at all (Nemotron Parse 3.5's one-step auxiliary MTP proposer: "
               "an embedding and two linear projections over the target's hidden state, "
               "vllm/model_executor/models/nemotron_parse3_5_mtp.py:16-55); it adds nothing to the target's "
               "KV cache, and served alone there is no cache to plan"),
    "ExtractHiddenStatesModel": DraftVerdict(
        True, "a draft only (--speculative-config method extract_hidden_states; it asserts a speculative "
              "config, vllm/model_executor/models/extract_hidden_states.py:325) whose one CacheOnlyAttentionLayer "
              "adds a HiddenStateCacheSpec of len(eagle_aux_hidden_state_layer_ids) heads x the target's hidden "
              "size, in the model dtype (:306-313, :331-357), to the target's KV cache: one page more in a "
              "full-attention target's one group (a hybrid target's grouping of it, vLLM 0.34.0 "
              "vllm/v1/core/kv_cache_planning.py:1125-1156, :1192-1209, is named unplanned)",
        "planner/hidden_states.py"),
    "DSparkDraftModel": DraftVerdict(
        True, "a draft only (DeepSeek-V4's DSpark draft, --speculative-config method dspark; it asserts a speculative "
              "config, vllm/models/deepseek_v4/nvidia/dspark.py:92): `n_mtp_layers` (3 when unset) more decoder "
              "layers of DeepseekV4Attention at layers.{num_hidden_layers + i} (vLLM 0.34.0, :106, :132-141), "
              "sliding-only (attention.py:238-243), whose caches join the target's", "planner/deepseek_v4.py"),
    "DSparkV41DraftModel": DraftVerdict(
        True, "a draft only (DeepSeek-V4.1's DSpark draft, --speculative-config method dspark; it asserts a "
              "speculative config, vllm/models/deepseek_v41/nvidia/dspark.py:76): `n_mtp_layers` or "
              "`num_nextn_predict_layers` (3 when unset) more decoder layers of DeepseekV4Attention at "
              "layers.{num_hidden_layers + i} (vLLM 0.34.0, :90-94, :125-134), never kv or index sources "
              "(attention.py:403-405), each adding a block-32 sliding cache to the target's; drafting also widens "
              "the target's compressor rings to max(8, next power of two of num_speculative_tokens + 2) rows "
              "(vllm/models/deepseek_v41/compressor.py:250-252)", "planner/deepseek_v41.py"),
    "Dots3NoteMTPModel": DraftVerdict(
        True, "a draft head only (Dots3's MTP head, --speculative-config method mtp or dots3_note_mtp: vLLM maps a Dots3 "
              "target to it, vLLM 0.34.0 vllm/config/speculative.py:832-846; it asserts a speculative config, "
              "vllm/models/dots3_note/nvidia/mtp.py:37, :106) whose num_nextn_predict_layers Dots3 decoder layers of "
              "`mtp_layer_types` (sliding when unset; :103-120, :53-57) join the target's KV cache",
        "planner/dots3_note.py"),
    "MistralLarge4DSparkModel": DraftVerdict(
        True, "a draft only (Mistral Large 4's DSpark draft, --speculative-config method dspark, read from the target's "
              "params.json `mtp` section, vLLM 0.34.0 vllm/transformers_utils/configs/mistral.py:477-545; it asserts a "
              "speculative config, vllm/models/mistral/mistral_large4/nvidia/dspark.py:88) whose `mtp.n_layers` dense, "
              "non-causal MLA layers at layers.{n_layers + i} (:122-146, :283-287) each add a latent of the target's "
              "width to its one group", "planner/mistral_large4.py"),
    "Glm5NextMTPModel": DraftVerdict(
        True, "a draft head only (GLM-5-Next's MTP head, --speculative-config method mtp or glm5_next_mtp: vLLM maps a "
              "GLM-5-Next target to it, vLLM 0.34.0 vllm/config/speculative.py:1281-1293; it asserts a speculative config, "
              "vllm/models/glm5next/common/mtp.py:51) whose num_nextn_predict_layers MLA decoder layers (:112-128, "
              ":70-81) join the target's KV cache", "planner/glm5_next.py"),
    "Qwen4ExpMTP": DraftVerdict(
        True, "a draft head only (Qwen4-Exp's MTP head, --speculative-config method mtp or qwen4_exp_mtp: vLLM maps a "
              "Qwen4-Exp target to it, vLLM 0.34.0 vllm/config/speculative.py:1032-1053; it raises without a draft model "
              "config, vllm/models/qwen4_exp/nvidia/mtp.py:131-133) whose mtp_num_hidden_layers QSA decoder layers "
              "(:198-249) join the target's KV cache", "planner/qwen4_exp.py"),
    "Step5MTP": DraftVerdict(
        True, "a draft head only (Step5's MTP head, --speculative-config method mtp or step5_mtp: vLLM maps a Step5 "
              "target to it, vLLM 0.34.0 vllm/config/speculative.py:1170-1185; its forward needs the target's hidden states, "
              "vllm/models/step5/nvidia/mtp.py:120-126) whose num_nextn_predict_layers Step5 decoder layers "
              "(:175-201) join the target's KV cache", "planner/step5_sparse.py"),
}


def draft_reason(architecture: str) -> str | None:
    """Why kvwatch gives this draft architecture a verdict of its own (None: not one of these drafts)."""
    found = DRAFTS.get(architecture)
    return None if found is None else found.reason


def planned_with_target(architecture: str) -> str:
    """The planner module that plans this draft's cache layers with its target's ("": none does)."""
    found = DRAFTS.get(architecture)
    return "" if found is None else found.planned_with
