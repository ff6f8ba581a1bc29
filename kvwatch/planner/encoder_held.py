"""What the V1 runner's multimodal profile keeps through the language model's pass besides the encoder cache (pure).

vLLM's V1 `profile_run` builds the dummy encoder batch as a local, on the GPU, and keeps it until
the function returns, so it is live through the language model's dummy pass and the sampler's,
like the encoder cache (planner/encoder_cache.py):

- **The dummy pixels**: `batched_dummy_mm_inputs`, moved to the device (vLLM 0.8.5.post1,
  vllm/v1/worker/gpu_model_runner.py:1636-1637, `as_kwargs(..., device=self.device)`; 0.9.2 :2252;
  0.10.2 :3010; 0.11.2 :4098 `_get_mm_dummy_batch`, which groups the items onto `self.device`;
  0.13.0 :4456; 0.28.0 :6600; 0.33.0 :6114), then `self._dummy_run(...)` (0.9.2 :2274; 0.11.2 :4135;
  0.13.0 :4474; 0.28.0 :6618) with only `hidden_states, output` deleted after it (0.11.2 :4146).
  A Qwen-VL item of T output tokens is T x merge^2 patches of C x T_patch x P^2 values
  (planner/encoder_forward.py), in the model dtype from 0.9 (the processor's outputs are cast:
  vLLM 0.9.2, vllm/inputs/registry.py:168-171; 0.11.2, vllm/multimodal/processing.py:1031-1032;
  0.28.0, vllm/multimodal/processing/context.py:246-247), in the processor's float32 before
  (vLLM 0.8.5.post1, vllm/inputs/registry.py has no such cast).
- **0.11.0-0.12.x, the unpadded encoder output**: the loop that pads each output to the encoder
  budget leaves its variable `output` on the last unpadded output (vLLM 0.11.2,
  vllm/v1/worker/gpu_model_runner.py:4121 `for output in dummy_encoder_outputs:`; 0.12.0 :4343),
  which lives until the sampler's pass reassigns it. A Qwen-VL tower returns its items as views of
  one tensor (`image_embeds.split(sizes)`: vLLM 0.11.2, vllm/model_executor/models/qwen2_vl.py:1461,
  qwen3_vl.py:1380 and :1405), so the last view keeps the whole batch's outputs; another model's
  output is counted as one item. Only when an item is smaller than the budget (the pad branch,
  0.11.2 :4119); 0.13.0 caches the outputs unpadded (:4470-4471), with nothing left beside them.

The V2 runner (planner's vllm_releases/model_runner_v2.py; the only runner from 0.34) builds its
dummy items on the host and moves them to the device inside its encoder call (vLLM 0.33.0,
vllm/v1/worker/gpu/mm/encoder_runner.py:150-158 execute_mm_encoder), so nothing is held: 0.

What the user's flags leave of the profile (`profiled_shape`), for every term of the encoder's profile:
- `--skip-mm-profiling`: no encoder pass and no encoder cache (vLLM 0.11.2,
  vllm/v1/worker/gpu_model_runner.py:4070-4074; 0.28.0 :6562-6566; 0.34.0,
  vllm/v1/worker/gpu/model_runner.py:1077).
- `--limit-mm-per-prompt` with a modality at 0: the profile leaves that modality out (vLLM 0.11.2,
  vllm/multimodal/registry.py:174, only modalities with `limit > 0`); with every modality of the model
  at 0 nothing is left, the encoder budget is 0 (v1/core/encoder_cache_manager.py:315-321) and the
  profile runs no encoder (gpu_model_runner.py:4079). The modalities are known for the Qwen-VL families
  (image and video) and Gemma 3 (image); another model's shape only loses the zeroed image's size.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kvwatch.planner.encoder_cache import (
    PADDED_SINCE,
    PADDED_UNTIL,
    EncoderShape,
    counted_and_encoded_tokens,
    profile_items,
)
from kvwatch.values.json_text import parse_json

PIXELS_CAST_SINCE = (0, 9, 0)       # the processor's floating outputs cast to the model dtype
FLOAT32_BYTES = 4
SPLIT_VIEW_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
_MODALITIES = {**dict.fromkeys(SPLIT_VIEW_FAMILIES, ("image", "video")), "gemma3": ("image",)}


def tower_modalities(family: str | None) -> tuple[str, ...]:
    """The modalities a family's vision tower serves, where kvwatch knows them; () otherwise."""
    return _MODALITIES.get(family or "", ())


def mm_limits(value: str | None) -> tuple[tuple[str, int], ...]:
    """--limit-mm-per-prompt's counts: a JSON object of counts (or of {"count": n, ...} from 0.11),
    or the older `image=2,video=0` form; () when not given or not readable."""
    if not value:
        return ()
    try:
        parsed = parse_json(value)
    except ValueError:
        parsed = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
    if not isinstance(parsed, dict):
        return ()
    counts = []
    for modality, limit in parsed.items():
        count = limit.get("count") if isinstance(limit, dict) else limit
        if isinstance(count, str) and count.strip().isdigit():
            count = int(count)
        if isinstance(count, int) and not isinstance(count, bool):
            counts.append((str(modality).strip(), count))
    return tuple(counts)


def profiled_shape(shape: EncoderShape | None, limits: Mapping[str, int], skip_mm_profiling: bool
                   ) -> EncoderShape | None:
    """The encoder shape the profile runs under the user's flags (the module's list); None: no encoder profile."""
    if shape is None or skip_mm_profiling:
        return None
    modalities = _MODALITIES.get(shape.family)
    if modalities is not None and all(limits.get(m) == 0 for m in modalities):
        return None
    return replace(shape, image_tokens=0 if limits.get("image") == 0 else shape.image_tokens,
                   video_tokens=0 if limits.get("video") == 0 else shape.video_tokens)


def dummy_pixel_bytes(shape: EncoderShape, version: tuple[int, int, int], items: int, encoded_tokens: int,
                      dtype_bytes: int) -> int:
    """The dummy batch's pixels on the device: items x tokens x merge^2 patches x values per patch
    (0 where the tower is not sized, planner/encoder_forward.py)."""
    tower = shape.tower
    if tower is None or items <= 0 or encoded_tokens <= 0:
        return 0
    element = dtype_bytes if version >= PIXELS_CAST_SINCE else FLOAT32_BYTES
    return items * encoded_tokens * tower.merge * tower.merge * tower.patch_values * element


def unpadded_output_bytes(shape: EncoderShape, version: tuple[int, int, int], items: int, encoded_tokens: int,
                          budget: int, dtype_bytes: int) -> int:
    """0.11.0-0.12.x: the last unpadded encoder output the pad loop leaves live (the module's list)."""
    if not PADDED_SINCE <= version < PADDED_UNTIL or items <= 0 or not 0 < encoded_tokens < budget:
        return 0
    kept_items = items if shape.family in SPLIT_VIEW_FAMILIES else 1
    return kept_items * encoded_tokens * shape.output_width * dtype_bytes


def profile_inputs_held_bytes(shape: EncoderShape | None, version: tuple[int, int, int], max_num_batched_tokens: int,
                              max_num_seqs: int, dtype_bytes: int, v2_runner: bool) -> int:
    """Bytes the V1 runner's profile keeps beside the encoder cache through the language model's pass."""
    if shape is None or v2_runner or max_num_batched_tokens <= 0:
        return 0
    items, _, budget = profile_items(shape, version, max_num_batched_tokens, max_num_seqs)
    encoded = counted_and_encoded_tokens(shape, version)[1]
    return (dummy_pixel_bytes(shape, version, items, encoded, dtype_bytes)
            + unpadded_output_bytes(shape, version, items, encoded, budget, dtype_bytes))
