"""Architectures vLLM refuses as configured, decided from config.json and the platform (pure).

Each rule is one of vLLM 0.32's refusals of a model, before any KV cache is sized:

- sparse attention (an MLA model with the DeepSeek-V3.2 indexer: `index_topk` in config.json,
  model_executor/models/deepseek_v2.py `is_v32`) on the CPU backend: platforms/cpu.py:150
  get_attn_backend_cls, "Sparse Attention is not supported on CPU.";
- a sliding window on only some Qwen2 layers (use_sliding_window with max_window_layers below
  num_hidden_layers; transformers then lists both layer types): model_executor/models/qwen2.py:352,
  "Sliding window for some but all layers is not supported.";
- an architecture vLLM dropped: model_executor/models/registry.py `_PREVIOUSLY_SUPPORTED_MODELS`,
  "Model architecture X was supported in vLLM until vY, and is not supported anymore."

The sentences themselves, as vLLM prints them, are what kvwatch diagnose matches in a log
(kvwatch/diagnosis/refusals.py); here the planner predicts them.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.layers import FULL, SLIDING

# vLLM 0.32 model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS: architecture -> the
# last release that served it.
PREVIOUSLY_SUPPORTED: dict[str, str] = {
    "MotifForCausalLM": "0.10.2", "Phi3SmallForCausalLM": "0.9.2", "Phi4FlashForCausalLM": "0.10.2",
    "Phi4MultimodalForCausalLM": "0.12.0", "JAISLMHeadModel": "0.22.0", "ErnieModel": "0.23.0",
    "InternLM2VEForCausalLM": "0.23.0", "QWenLMHeadModel": "0.23.0",
    "QwenVLForConditionalGeneration": "0.23.0", "InternLMForCausalLM": "0.23.0",
    "DonutForConditionalGeneration": "0.10.2", "MllamaForConditionalGeneration": "0.10.2",
    "XverseForCausalLM": "0.23.0", "Dots1ForCausalLM": "0.23.0", "BambaForCausalLM": "0.23.0",
    "MiniMaxForCausalLM": "0.23.0", "MiniMaxText01ForCausalLM": "0.23.0", "MiniMaxM1ForCausalLM": "0.23.0",
    "MiniMaxVL01ForConditionalGeneration": "0.23.0", "BaiChuanForCausalLM": "0.23.0",
    "BaichuanForCausalLM": "0.23.0", "AquilaModel": "0.24.0", "AquilaForCausalLM": "0.24.0",
    "Grok1ModelForCausalLM": "0.24.0", "Grok1ForCausalLM": "0.24.0",
}

SPARSE_ATTENTION_ON_CPU = "Sparse Attention is not supported on CPU."
QWEN2_SOME_LAYERS_SLIDE = "Sliding window for some but all layers is not supported."


@dataclass(frozen=True)
class ArchitectureRefusal:
    kind: str          # "no_attention_backend" or "config_refused" (kvwatch.failure_kinds values)
    message: str       # vLLM's sentence, then what it means here
    fix: dict[str, object]   # flag -> value that avoids it; {} when no flag does


def refusals(geometry: ModelGeometry, settings: EngineSettings, device: Device) -> list[ArchitectureRefusal]:
    """What vLLM 0.32 refuses about this architecture on this platform, in the order it checks."""
    out: list[ArchitectureRefusal] = []
    for arch in geometry.architectures:
        if arch in PREVIOUSLY_SUPPORTED:
            out.append(ArchitectureRefusal(
                "config_refused",
                f"Model architecture {arch} was supported in vLLM until v{PREVIOUSLY_SUPPORTED[arch]}, and is "
                f"not supported anymore: serve it with vLLM {PREVIOUSLY_SUPPORTED[arch]} or older", {}))
            return out
    if geometry.sparse_attention and device.platform == "cpu":
        out.append(ArchitectureRefusal(
            "no_attention_backend",
            f"{SPARSE_ATTENTION_ON_CPU} This model's attention is sparse (a DeepSeek-V3.2 indexer): "
            f"serve it on a GPU", {}))
    kinds = set(geometry.layout.kinds)
    if geometry.model_type == "qwen2" and {FULL, SLIDING} <= kinds:
        out.append(ArchitectureRefusal(
            "config_refused",
            f"{QWEN2_SOME_LAYERS_SLIDE} config.json slides only layers from max_window_layers on; vLLM's "
            f"Qwen2 needs the window on every layer or none (use_sliding_window false in config.json)", {}))
    return out
