"""How each vLLM release aligns the attention block size of a hybrid (attention + recurrent state)
model so that one attention page holds one state, and pads the state's page to it (pure data).

Written by hand from each release's source, one row per change, each with its source line; the
oracle scripts/check_release_functions.py (check hybrid_block_size) runs each release's own
function against kvwatch/planner/kv_groups.hybrid_block_size on a table of inputs.
"""
from __future__ import annotations

from typing import NamedTuple

from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.gdn_checkpoint import GDN_CHECKPOINT_HYBRID_ALIGNMENT_SOURCE


class HybridAlignment(NamedTuple):
    since: str                  # the first release kvwatch read with these rules
    source: str                 # where the release aligns
    kernel_alignment: bool      # True: the backend's smallest kernel block, at least the block size in
                                # force; False: a fixed alignment, whatever the backend and block size
    fixed_alignment: int = 16
    fixed_mla_alignment: int = 16       # MLA, before 0.20 (128 when CUTLASS_MLA is asked for by name)
    mla_at_least: int = 0       # MLA, 0.27+: the alignment is at least this
    mla_at_least_source: str = ""
    backend_lcm_source: str = ""        # the block is rounded to every backend's smallest kernel block
    checkpoint_alignment_source: str = ""   # align mode: the alignment is also a multiple of the state
                                            # layers' prefill checkpoint alignment (gdn_checkpoint.py)


_PRE = "vllm/model_executor/models/config.py"   # HybridAttentionMambaModelConfig.verify_and_update_config
_PLATFORM = "vllm/platforms/interface.py"       # Platform._align_hybrid_block_size
ALIGNMENTS: tuple[HybridAlignment, ...] = (
    # a multiple of 16 tokens for every backend, MLA included
    HybridAlignment("0.10.2", f"vLLM 0.10.2, {_PRE}:381", kernel_alignment=False),
    # MLA: 64 (128 when VLLM_ATTENTION_BACKEND / --attention-backend names CUTLASS_MLA)
    HybridAlignment("0.11.2", f"vLLM 0.11.2, {_PRE}:349", kernel_alignment=False, fixed_mla_alignment=64),
    # the platform aligns: the backend's smallest kernel block, at least the block size in force
    HybridAlignment("0.20.2", f"vLLM 0.20.2, {_PLATFORM}:577", kernel_alignment=True),
    HybridAlignment("0.27.1", f"vLLM 0.27.1, {_PLATFORM}:876", kernel_alignment=True,
                    mla_at_least=128, mla_at_least_source=f"vLLM 0.27.1, {_PLATFORM}:888"),
    HybridAlignment("0.32.0", f"vLLM 0.32.0, {_PLATFORM}:1062", kernel_alignment=True,
                    mla_at_least=128, mla_at_least_source=f"vLLM 0.32.0, {_PLATFORM}:1082",
                    backend_lcm_source=f"vLLM 0.32.0, {_PLATFORM}:1070"),
    # 0.33 also aligns to the state layers' prefill checkpoint in align mode: none for most layers,
    # 64 tokens for a gated delta net layer on FlashInfer's prefill (vllm_releases/gdn_checkpoint.py)
    HybridAlignment("0.33.0", f"vLLM 0.33.0, {_PLATFORM}:940", kernel_alignment=True,
                    mla_at_least=128, mla_at_least_source=f"vLLM 0.33.0, {_PLATFORM}:1088",
                    backend_lcm_source=f"vLLM 0.33.0, {_PLATFORM}:1076",
                    checkpoint_alignment_source=GDN_CHECKPOINT_HYBRID_ALIGNMENT_SOURCE),
)


def hybrid_alignment_for(release: str) -> HybridAlignment:
    """The rules of vLLM `release`: the last row at or before it (the first row before any)."""
    v = parse_version(release).parts
    rows = [a for a in ALIGNMENTS if parse_version(a.since).parts <= v]
    return rows[-1] if rows else ALIGNMENTS[0]
