"""The weights of the drafts planned with an own-packed target (pure).

Step5 (planner/step5_sparse.py), GLM-5-Next (planner/glm5_next.py), Qwen4-Exp (planner/qwen4_exp.py) and
Dots3 (planner/dots3_note.py) plan their MTP draft's cache layers with the target's where `--speculative-config` drafts with `mtp`,
DeepSeek-V4 and V4.1 (planner/deepseek_v4.py, deepseek_v41.py) their DSpark draft's with `dspark`.
The draft's weights load beside the target's in the same engine, so without `--kv-cache-memory-bytes`
they come out of the KV cache's memory as the older MTP heads' do (planner/mtp_draft.py
`draft_weights`, added to the target's count by `with_draft_weights`). What each head holds, as vLLM
0.34.0 builds it:

- Step5MTP (vllm/models/step5/nvidia/mtp.py): `num_nextn_predict_layers` Step5DecoderLayer (:115-118,
  :190-201), dense only (:304-305: Step5MLP of `intermediate_size`, model.py:1941-1944); per layer an
  `eh_proj = nn.Linear(2 hidden, hidden)` (:111: unquantized, whole on every rank) and a
  `shared_head.head = ParallelLMHead(vocab, hidden)` (:85-90, :112-114), which the draft keeps
  (`has_own_lm_head = True`, :273; "each MTP layer retains its own checkpoint head", :291-295); the
  embedding is the target's (`has_own_embed_tokens` unset, model_executor/models/interfaces.py:1562:
  v1/worker/gpu/spec_decode/eagle/utils.py:20-27, :84-112, :143). vLLM drops the per-layer heads only
  where the loaded values equal the target's LM head (eagle/utils.py:28-42, :145-160), which config.json
  cannot tell: kvwatch counts them.
- Glm5NextMTPModel (vllm/models/glm5next/common/mtp.py): `num_nextn_predict_layers` Glm5NextDecoderLayer
  (:74-81: an MLA layer with the MoE MLP, :227-238), per layer an `eh_proj = nn.Linear(2 hidden, hidden)`
  (:57) and no LM head (`SharedHead(defer_lm_head=True)`, :65-69; model_executor/models/deepseek_mtp.py:59-60);
  the embedding (:129-133) and LM head are the target's (eagle/utils.py:45-72, :84-112).
- Qwen4ExpMTP (vllm/models/qwen4_exp/nvidia/mtp.py): `mtp_num_hidden_layers` (1 when unset, :199)
  Qwen4ExpDecoderLayer (:241-249) and, once for the draft, `fc_embedding` and `fc_hidden`, two
  ColumnParallelLinear(hidden, hidden) quantized as the target (:223-240: split over the ranks); its
  embedding (:204) and LM head (:446-456) are replaced by the target's (eagle/utils.py:45-72, :84-112).

Each draft decoder layer counts as planner/weights.py counts the target's (count_weights), a full-attention
layer of the target's shapes; the draft's norms, like the target's, are left out.

- DSparkDraftModel and DSparkV41DraftModel (vllm/models/deepseek_v4/nvidia/dspark.py and
  deepseek_v41/nvidia/dspark.py): `n_mtp_layers` (V4.1: or `num_nextn_predict_layers`; 3 when unset)
  DeepseekV4DecoderLayer with the MoE MLP (V4 :106, :132-141; V4.1 :90-94, :125-134); a
  `main_proj = ReplicatedLinear(hidden x len(dspark_target_layer_ids), hidden)` (V4 :115-122, V4.1 :103-110)
  and a `context_wkv_proj = MergedColumnParallelLinear(hidden, [head_dim] x layers, disable_tp=True)`
  (V4 :142-149, V4.1 :136-144), both quantized as the target and whole on every rank; a Markov head
  (V4 :169-174, V4.1 :155-160): `markov_w1 = nn.Embedding(vocab, dspark_markov_rank)` and
  `markov_w2 = ParallelLMHead(draft_vocab_size or vocab, dspark_markov_rank, disable_tp=True)`, unquantized
  and whole on every rank (model_executor/models/qwen3_dspark.py:49-80). Embedding and LM head are the
  target's (`has_own_embed_tokens = has_own_lm_head = False`, V4 :351-352, V4.1 :294-295, shared by
  v1/worker/gpu/spec_decode/dspark/utils.py:134-145). Left out as the norms are: V4's hyper-connection
  head (hc_mult x hc_mult x hidden floats, :156-165) and the confidence head (hidden + rank floats,
  qwen3_dspark.py:165-184).

- Dots3NoteMTPModel (vllm/models/dots3_note/nvidia/mtp.py): `num_nextn_predict_layers` Dots3NoteDecoderLayer
  (:53-57, :110-120: MLA layers with the MoE MLP, :168), per layer an `eh_proj = ReplicatedLinear(2 hidden,
  hidden)` quantized as the target and whole on every rank (:43-49); its per-layer SharedHead LM heads
  (:50-52) are replaced by the target's (`has_own_lm_head = False`, :159; eagle/utils.py:145-160), but it
  keeps its own embedding (`has_own_embed_tokens = True`, :158; VocabParallelEmbedding(vocab, hidden),
  :121-125) unless its loaded values equal the target's (eagle/utils.py:20-42, :112), which config.json
  cannot tell: kvwatch counts it. A config.json without the shapes count_weights needs (hidden_size) has no
  weight estimate, the target's nor the draft's.

Not counted here: DeepSeek-V4's own MTP head (method `mtp`, planner/deepseek_v4.py plans its layers).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.planner.deepseek_v4 import DeepseekV4Shape
from kvwatch.planner.deepseek_v41 import DeepseekV41Shape
from kvwatch.planner.dots3_note import Dots3Shape
from kvwatch.planner.glm5_next import Glm5NextShape
from kvwatch.planner.mtp_draft import EXPERT_FIELDS, draft_weights
from kvwatch.planner.qwen4_exp import Qwen4ExpShape
from kvwatch.planner.step5_sparse import Step5Shape
from kvwatch.planner.weights import WeightCount
from kvwatch.values.config_values import positive_int


@dataclass(frozen=True)
class DraftHead:
    name: str
    plain_projection: bool   # the hidden-state projection is an nn.Linear: unquantized, whole on every rank
    projection_per_layer: bool   # 2 hidden x hidden per draft layer (else 2 for the whole draft)
    dense: bool = False       # each draft layer's MLP is dense (intermediate_size) whatever the target's experts
    own_lm_heads: bool = False   # each draft layer keeps a ParallelLMHead(vocab, hidden) of its own
    replicated_projection: bool = False   # a ReplicatedLinear projection: quantized, whole on every rank
    own_embedding: bool = False   # the draft keeps a VocabParallelEmbedding(vocab, hidden) of its own


STEP5 = DraftHead("Step5MTP", plain_projection=True, projection_per_layer=True, dense=True, own_lm_heads=True)
GLM5_NEXT = DraftHead("Glm5NextMTPModel", plain_projection=True, projection_per_layer=True)
QWEN4_EXP = DraftHead("Qwen4ExpMTP", plain_projection=False, projection_per_layer=False)
DOTS3 = DraftHead("Dots3NoteMTPModel", plain_projection=False, projection_per_layer=True, replicated_projection=True,
                  own_embedding=True)


def head_weights(cfg: Mapping[str, Any], layers: int, head: DraftHead) -> WeightCount | None:
    """The parameters a draft head of `layers` decoder layers loads beside the target (None: none, or the
    config lacks the shapes): its layers and projections, and the LM heads of a head that keeps its own."""
    if layers <= 0:
        return None
    base = {k: v for k, v in cfg.items() if k not in EXPERT_FIELDS} if head.dense else cfg
    count = draft_weights(base, layers, head.plain_projection, None if head.projection_per_layer else 2)
    if count is None:
        return None
    vocab_rows = (layers if head.own_lm_heads else 0) + (1 if head.own_embedding else 0)
    projection = 2 * layers * count.hidden_size * count.hidden_size if head.replicated_projection else 0
    return replace(count, embedding_params=vocab_rows * positive_int(cfg, "vocab_size") * count.hidden_size,
                   replicated_linear_params=count.replicated_linear_params + projection)


def dspark_weights(cfg: Mapping[str, Any], layers: int) -> WeightCount | None:
    """The parameters DeepSeek-V4's or V4.1's DSpark draft of `layers` layers loads beside the target: its
    MoE decoder layers, `main_proj` and `context_wkv_proj` (quantized, whole on every rank) and the Markov
    head (unquantized, whole on every rank)."""
    count = draft_weights(cfg, layers, False, 0) if layers > 0 else None
    if count is None:
        return None
    hidden, vocab, rank = count.hidden_size, positive_int(cfg, "vocab_size"), positive_int(cfg, "dspark_markov_rank")
    targets = cfg.get("dspark_target_layer_ids")
    replicated = (len(targets) if isinstance(targets, list) else 0) * hidden * hidden \
        + hidden * positive_int(cfg, "head_dim") * layers
    markov = vocab * rank + (positive_int(cfg, "draft_vocab_size") or vocab) * rank
    return replace(count, linear_params=count.linear_params + replicated + markov,
                   replicated_linear_params=count.replicated_linear_params + replicated,
                   router_params=count.router_params + markov)


AnyShape = Step5Shape | Glm5NextShape | Qwen4ExpShape | Dots3Shape | DeepseekV4Shape | DeepseekV41Shape


def packed_draft_weights(cfg: Mapping[str, Any], shape: AnyShape | None) -> WeightCount | None:
    """The draft's weights of a Step5, GLM-5-Next, Qwen4-Exp or Dots3 (text) config.json (its MTP head), or of a
    DeepSeek-V4 or V4.1 one (its DSpark draft) (None: another model, or no draft); the layer count as the
    model's planner reads it."""
    if isinstance(shape, Step5Shape):
        return head_weights(cfg, shape.mtp_modules, STEP5)
    if isinstance(shape, Glm5NextShape):
        return head_weights(cfg, shape.mtp_layers, GLM5_NEXT)
    if isinstance(shape, Qwen4ExpShape):
        return head_weights(cfg, shape.mtp_layers, QWEN4_EXP)
    if isinstance(shape, Dots3Shape):
        return head_weights(cfg, len(shape.mtp_sliding), DOTS3)
    if isinstance(shape, (DeepseekV4Shape, DeepseekV41Shape)):
        return dspark_weights(cfg, shape.dspark_layers)
    return None
