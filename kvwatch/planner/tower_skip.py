"""Whether vLLM builds a multimodal model's vision tower under the user's flags (pure).

From 0.15 a multimodal model marks its towers (`SupportsMultiModal._mark_tower_model`), and a tower
whose modalities all have a limit of 0 is never built: its weights are not loaded and the profile
runs no encoder (vLLM 0.15.0 and 0.28.0, vllm/model_executor/models/interfaces.py `_mark_tower_model`:
`no_init_weights(...) if all(mm_config.get_limit_per_prompt(m) == 0 for m in modalities)`; 94 of the
96 multimodal model files of 0.32.0 mark their towers). The limits are `--limit-mm-per-prompt`'s, and
`--language-model-only` (from 0.17) sets every modality's to 0 (vLLM 0.21.0, vllm/config/multimodal.py:77-79
and :315-316, `get_limit_per_prompt`: `if self.language_model_only: return 0`).

A tower's modalities are known for the Qwen-VL families (image and video) and Gemma 3 (image)
(planner/encoder_held.py); for another model only `--language-model-only` leaves its tower out.
Before 0.15 kvwatch counts the tower whatever the limits (some models checked their limits by hand
then, e.g. Qwen2.5-VL from 0.11; kvwatch does not follow them).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kvwatch.planner.encoder_held import tower_modalities
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.weights import WeightCount

TOWER_SKIP_SINCE = (0, 15, 0)      # _mark_tower_model, vLLM 0.15.0 vllm/model_executor/models/interfaces.py
ALL_MODALITIES = ("image", "video", "audio")


def modality_limits(limits: Mapping[str, int], language_model_only: bool) -> dict[str, int]:
    """The items per prompt vLLM allows each modality: --limit-mm-per-prompt's, every one 0 under
    --language-model-only (MultiModalConfig.get_limit_per_prompt)."""
    if language_model_only:
        return dict.fromkeys(ALL_MODALITIES, 0)
    return dict(limits)


def tower_built(family: str | None, limits: Mapping[str, int], language_model_only: bool,
                version: tuple[int, int, int]) -> bool:
    """Whether the vision tower of a model of `family` (its config's model type; None: not known) is
    built: False from 0.15 when --language-model-only is given, or when every modality the tower
    serves is limited to 0."""
    if version < TOWER_SKIP_SINCE:
        return True
    if language_model_only:
        return False
    modalities = tower_modalities(family)
    return not (modalities and all(limits.get(m) == 0 for m in modalities))


def loaded_count(count: WeightCount | None, settings: EngineSettings, version: tuple[int, int, int]
                 ) -> WeightCount | None:
    """The weights vLLM loads: the count without its vision tower and encoder when the tower is not
    built (no tower weights, no encoder profile), else the count as it is."""
    if count is None or not count.vision_params and count.encoder is None:
        return count
    family = count.encoder.family if count.encoder is not None else None
    limits = modality_limits(dict(settings.mm_limits), settings.language_model_only)
    if tower_built(family, limits, settings.language_model_only, version):
        return count
    return replace(count, vision_params=0, encoder=None)
