"""How each vLLM release derives its default max_model_len from the RoPE scaling (pure), expanded
from the generated table's changes (generated/max_len_rules.py, scripts/gen_max_len_rules.py)."""
from __future__ import annotations

from typing import NamedTuple

from kvwatch.vllm_releases.generated.max_len_rules import BASE, BASE_RELEASE, CHANGES
from kvwatch.vllm_releases.release_chain import expand_fields


class MaxLenRules(NamedTuple):
    prescaled_rope_types: tuple[str, ...]   # types whose length already includes the scaling
    prescaled_source: str
    yarn_from_original_source: str   # "": yarn does not start from original_max_position_embeddings
    longrope_default_source: str     # "": LongRoPE keeps the derived length as its default


MAX_LEN_RULES: dict[str, MaxLenRules] = {
    release: MaxLenRules(**fields)   # type: ignore[arg-type]
    for release, fields in expand_fields(BASE_RELEASE, BASE, CHANGES).items()}
