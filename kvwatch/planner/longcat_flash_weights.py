"""LongCat-Flash's decoder blocks (model_type longcat_flash) as vLLM builds them (pure).

config.json counts `num_layers` blocks. vLLM 0.32.0 builds one FlashDecoderLayer per block
(vllm/model_executor/models/longcat_flash.py:395-396), each with two MLA attentions, every one its own KV
cache (:266-287), two dense MLPs of intermediate_size (:299-311) and one MoE of n_routed_experts experts of
moe_intermediate_size (:313-321) whose router scores n_routed_experts + zero_expert_num outputs, the zero
experts being identities without weights (:157-167). transformers 5.19.0 answers the standard keys from the
file's own: intermediate_size is ffn_hidden_size, moe_intermediate_size expert_ffn_hidden_size
(models/longcat_flash/configuration_longcat_flash.py:58-62) and num_hidden_layers is 2 x num_layers, the
attention sublayers (:117-119), which is what kvwatch counts as layers here.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.values.config_values import positive_int as _int

LONGCAT_FLASH = "longcat_flash"
_ALIASES = (("intermediate_size", "ffn_hidden_size"), ("moe_intermediate_size", "expert_ffn_hidden_size"))


def longcat_flash_keys(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """`cfg` with the standard keys transformers answers for LongCat-Flash (a key the file states wins,
    except num_hidden_layers, which the class always derives from num_layers)."""
    out = dict(cfg)
    for standard, own in _ALIASES:
        if out.get(standard) is None and out.get(own) is not None:
            out[standard] = out[own]
    blocks = _int(cfg, "num_layers") or _int(cfg, "num_hidden_layers") // 2   # the setter halves it (:121-123)
    if blocks:
        out["num_hidden_layers"] = 2 * blocks
    return out


@dataclass(frozen=True)
class FlashBlocks:
    blocks: int           # decoder blocks: one MoE each
    sublayers: int        # 2 x blocks: the attentions and the dense MLPs
    router_outputs: int   # n_routed_experts + zero_expert_num


def flash_blocks(cfg: Mapping[str, Any]) -> FlashBlocks | None:
    """LongCat-Flash's block shape from its standard keys (longcat_flash_keys); None for another family."""
    if cfg.get("model_type") != LONGCAT_FLASH:
        return None
    sublayers = _int(cfg, "num_hidden_layers")
    return FlashBlocks(blocks=sublayers // 2, sublayers=sublayers,
                       router_outputs=_int(cfg, "n_routed_experts") + _int(cfg, "zero_expert_num"))
