"""vLLM's refusal of an explicit 16-bit KV cache dtype other than the model's (pure).

From 0.33 VllmConfig._reject_mismatched_float_kv_cache refuses --kv-cache-dtype float16 or bfloat16
when the model runs in another dtype (vLLM 0.33.0, vllm/config/vllm.py:1492-1508, called at :1540;
0.34.0 :1431, called at :1484); 0.32 stored the cache in the dtype asked for.
"""
from __future__ import annotations

from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.predicted_refusal import CONFIG_REFUSED, PredictedRefusal
from kvwatch.values.versions import VllmVersion

REFUSED_SINCE = (0, 33, 0)
SOURCE = "vLLM 0.33.0, vllm/config/vllm.py:1492-1508"
_NAMES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32", "float32": "float32"}


def model_dtype(dtype_flag: str, config_dtype: str | None) -> str:
    """The model's dtype as vLLM resolves --dtype: `auto` keeps config.json's 16-bit dtype and
    downcasts float32 (or none) to bfloat16."""
    if dtype_flag != "auto":
        return _NAMES.get(dtype_flag, dtype_flag)
    return "bfloat16" if config_dtype in (None, "float32") else config_dtype


def mismatched_16bit_kv(settings: EngineSettings, config_dtype: str | None,
                        version: VllmVersion | None) -> PredictedRefusal | None:
    """vLLM's ValueError, in its words, when the release refuses this command's KV dtype."""
    cache = settings.kv_cache_dtype
    if cache not in ("float16", "bfloat16") or (version is not None and version.parts < REFUSED_SINCE):
        return None
    model = model_dtype(settings.dtype, config_dtype)
    if model == cache:
        return None
    allowed = f"`auto` or `{model}`" if model in ("float16", "bfloat16") else "`auto`"
    return PredictedRefusal(CONFIG_REFUSED,
                            f'ValueError: kv_cache_dtype="{cache}" is incompatible with dtype="{model}". '
                            f"Please set `--kv-cache-dtype` to {allowed}. ({SOURCE})",
                            FlagChange({"--kv-cache-dtype": "auto"}))
