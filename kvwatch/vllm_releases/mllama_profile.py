"""Llama 3.2 Vision (Mllama) in the V0 memory profile: its vision encoder's peak, release by release (pure).

vLLM ran Mllama on the V0 engine only, from its first release to its last (0.10.2; gone from 0.11's
registry): before 0.8 V0 is the default engine, and from 0.8 the model is `SupportsV0Only`, so the
engine falls back to V0 unless VLLM_USE_V1=1 forbids it (vLLM 0.8.5.post1 and 0.10.2,
vllm/model_executor/models/mllama.py `class MllamaForConditionalGeneration(..., SupportsV0Only)`;
vllm/engine/arg_utils.py:1403 and :1480, `if not model_config.is_v1_compatible: _raise_or_fallback`).

The V0 encoder-decoder profile builds `max_num_seqs` dummy sequences and gives each one dummy image
(limit_mm_per_prompt defaults to one), so the vision encoder runs once over max_num_seqs images
(vLLM 0.6.6.post1, vllm/worker/enc_dec_model_runner.py:263-323 profile_run; the same loop in 0.6.3.post1
:304, 0.8.5.post1 :305, 0.10.2 :316). The dummy image (1024 x 1024, mllama.py dummy_image) fills all
`max_num_tiles` tiles. Its peak is in a global-encoder layer's MLP, at the GELU (vLLM 0.6.6.post1,
vllm/model_executor/models/mllama.py:427-480 MllamaVisionEncoderLayer, :592-692 MllamaVisionModel.forward;
the vision model is the same in 0.6.3.post1, 0.8.5.post1 and 0.10.2), where these are live per image:

- the aspect-ratio attention mask, dense over the padded sequence: L^2 elements in the model dtype,
  L = tiles x (patches + 1 class token, padded to a multiple of 8) (:228-255, :642-648); 0.10.2's
  attention no longer reads it, but the vision model still builds and holds it;
- the local encoder's output tuple (its last hidden state and the `intermediate_layers_indices`
  states, kept by `output`) and their `torch.stack` copy (:656-658): (1 + 2 x n) x L x hidden;
- four L x hidden tensors: the global encoder's input, the layer's input, its residual and its
  normed MLP input;
- the MLP's first projection and the GELU's output: 2 x L x intermediate / TP (fc1 is column-parallel;
  the hidden states are whole on every rank: o_proj and fc2 all-reduce);
- the float32 pixel batch (tiles x 3 x image^2), twice up to 0.6.6.post1, where
  _parse_and_validate_image_input copies it into a new float32 batch (0.6.6.post1 :1213-1237), once
  from 0.7.3 on (passed through; 0.8.5.post1 :1223-1246 unpack_data returns a batched tensor as is).

The language model's pass follows, with the projected vision states (tiles x (patches + 1) tokens
of the text hidden size per image) held through it; the V0 profile's peak is the larger of the two.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.values.config_values import positive_int

MODEL_TYPE = "mllama"
MLLAMA_ARCHITECTURE = "MllamaForConditionalGeneration"
V0_ONLY_SINCE = (0, 8, 0)      # V1 became the default engine; Mllama falls back to V0 (SupportsV0Only)
LAST_RELEASE = (0, 10, 2)      # the last release that registers MllamaForConditionalGeneration
# Read in 0.6.6.post1 (a second float32 copy) and 0.7.3 (none); 0.7.0-0.7.2 are taken as 0.7.3.
PIXEL_COPY_UNTIL = (0, 7, 0)
PIXEL_BYTES = 4                # the image processor's float32 pixel values
CHANNELS = 3
PATCH_PAD = 8                  # the vision model pads each tile's patches to a multiple of 8
# transformers' MllamaVisionConfig default, which Llama 3.2 Vision's config.json repeats (5 states:
# vision_output_dim 7680 = 1280 x (1 + 5)); used when a config names neither.
DEFAULT_INTERMEDIATE_LAYERS = 5
LIVE_HIDDEN_STATES = 4         # global input, layer input, residual, normed MLP input


@dataclass(frozen=True)
class MllamaVision:
    """The vision tower's shapes the profile's peak depends on (config.json's vision_config)."""

    hidden_size: int
    intermediate_size: int
    image_size: int
    patch_size: int
    max_num_tiles: int
    intermediate_layers: int
    text_hidden_size: int

    @property
    def tile_tokens(self) -> int:
        """Tokens of one tile the language model attends to: its patches and the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def sequence(self) -> int:
        """L: one image's tokens in the vision encoder, each tile padded to a multiple of 8."""
        return self.max_num_tiles * -(-self.tile_tokens // PATCH_PAD) * PATCH_PAD


def mllama_vision(config: Mapping[str, Any]) -> MllamaVision | None:
    """The vision shapes of an Mllama config.json, else None (another model, or shapes missing)."""
    vision = config.get("vision_config")
    if config.get("model_type") != MODEL_TYPE or not isinstance(vision, Mapping):
        return None
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else config
    hidden = positive_int(vision, "hidden_size")
    shapes = (hidden, positive_int(vision, "intermediate_size"), positive_int(vision, "image_size"),
              positive_int(vision, "patch_size"), positive_int(vision, "max_num_tiles"))
    text_hidden = positive_int(text, "hidden_size") or positive_int(config, "hidden_size")
    if not all(shapes) or not text_hidden:
        return None
    layers, output_width = vision.get("intermediate_layers_indices"), positive_int(vision, "vision_output_dim")
    if isinstance(layers, list):
        states = len(layers)
    elif output_width > hidden:
        states = output_width // hidden - 1
    else:
        states = DEFAULT_INTERMEDIATE_LAYERS
    return MllamaVision(*shapes, intermediate_layers=states, text_hidden_size=text_hidden)


def runs_v0_profile(version: tuple[int, int, int]) -> bool:
    """Whether the release profiles Mllama on V0 (all that register it; V1 from 0.11 has no Mllama)."""
    return version <= LAST_RELEASE


def vision_peak_bytes(vision: MllamaVision, images: int, tensor_parallel: int, dtype_bytes: int,
                      version: tuple[int, int, int]) -> int:
    """The vision encoder's peak over `images` dummy images on one rank (the module's list)."""
    seq, hidden = vision.sequence, vision.hidden_size
    mlp_width = -(-vision.intermediate_size // max(1, tensor_parallel))
    elements = (seq * seq                                               # attention mask
                + (1 + 2 * vision.intermediate_layers) * seq * hidden  # output tuple and its stack
                + LIVE_HIDDEN_STATES * seq * hidden
                + 2 * seq * mlp_width)                                  # fc1 output and GELU's
    copies = 2 if version < PIXEL_COPY_UNTIL else 1
    pixels = copies * vision.max_num_tiles * CHANNELS * vision.image_size ** 2 * PIXEL_BYTES
    return images * (elements * dtype_bytes + pixels)


def cross_states_bytes(vision: MllamaVision, images: int, dtype_bytes: int) -> int:
    """The projected vision states the language model's pass holds (every rank whole)."""
    return images * vision.max_num_tiles * vision.tile_tokens * vision.text_hidden_size * dtype_bytes
