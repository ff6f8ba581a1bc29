"""The V2 GPU model runner: which models each release runs on it by default, and what it keeps
allocated outside the weights that the 0.27+ memory profile charges to the KV cache (pure data).

From 0.27 the profile's non-KV memory is the free memory lost from the worker's first snapshot to
the profile's end plus the transient peak (vLLM 0.27.1, vllm/utils/mem_utils.py:317-326), so every
torch allocation made after that snapshot counts, not only "Model loading took"; 0.26.0 summed the
loader's figure, the profile's torch peak increase and the non-torch increase (0.26.0
vllm/utils/mem_utils.py:309-313), which left out what was allocated between the two.
"""
from __future__ import annotations

from dataclasses import dataclass

# The first release whose budget takes the free memory consumed since the worker's snapshot.
TOTAL_CONSUMED_SINCE = (0, 27, 0)
TOTAL_CONSUMED_SOURCE = ("vLLM 0.27.1, vllm/utils/mem_utils.py:317-326 (total_consumed + transient_peak_headroom); "
                         "absent from 0.26.0, vllm/utils/mem_utils.py:309-313")


@dataclass(frozen=True)
class V2RunnerRule:
    """When a release runs a model on the V2 runner by default (CUDA, no VLLM_USE_V2_MODEL_RUNNER)."""

    since: tuple[int, int, int]
    every_model: bool                      # every generate model (0.29 on)
    listed_architectures: frozenset[str]   # MoE or hybrid architectures that default to it anyway
    source: str


_LISTED_0_27 = frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                          "InklingForConditionalGeneration", "KimiK3ForConditionalGeneration",
                          "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"})

# Oldest first; only the releases whose budget counts the runner's state (TOTAL_CONSUMED_SINCE on).
V2_RUNNER_RULES = (
    # a generate model that is neither MoE nor hybrid nor attention-free, or a listed architecture
    V2RunnerRule((0, 27, 0), False, _LISTED_0_27,
                 "vLLM 0.27.1, vllm/config/vllm.py:637-658 (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES :69-79)"),
    V2RunnerRule((0, 28, 0), False, _LISTED_0_27 | {"DeepseekV4ForCausalLM"},
                 "vLLM 0.28.0, vllm/config/vllm.py:691-712 (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES :69-80)"),
    # every model on CUDA but for unsupported features (stock torch.compile, sequence parallelism, ...)
    V2RunnerRule((0, 29, 0), True, frozenset(), "vLLM 0.29.0, vllm/config/vllm.py:645-677"),
)

# The sampler's penalty statistics, allocated with the sampler in load_model after the weights'
# DeviceMemoryProfiler block (so outside "Model loading took") and kept for the engine's life:
# output_bin_counts (max_num_seqs x vocab, int32) and prompt_bin_mask (max_num_seqs x vocab / 32
# words, int32) (vLLM 0.28.0, vllm/v1/worker/gpu/sample/penalties.py:32-42, created by Sampler at
# vllm/v1/worker/gpu/sample/sampler.py:51 from model_runner.py:398, after the block at :356-379;
# 0.27.1 model_runner.py:306/:352; the same tensors in 0.33.0 penalties.py:43-50).
# 0.34 removed the V1 runner: every model runs on V2, VLLM_USE_V2_MODEL_RUNNER=1 is only warned
# about and any other value refused (vLLM 0.34.0, vllm/platforms/interface.py:1481-1490).
V1_RUNNER_REMOVED_SINCE = (0, 34, 0)
V1_RUNNER_REMOVED_SOURCE = "vLLM 0.34.0, vllm/platforms/interface.py:1481-1490"
# Environment variables a release refuses as removed, with its hint (vLLM 0.34.0, vllm/envs.py:654-660).
REMOVED_ENV = {(0, 34, 0): {"VLLM_MARLIN_INPUT_DTYPE": (
    "Marlin no longer supports 8-bit activations. Use `--quantization humming` and set the activation dtype "
    "with VLLM_HUMMING_INPUT_QUANT_CONFIG, e.g. '{\"dtype\":\"int8\"}'.")}}
REMOVED_ENV_SOURCE = "vLLM 0.34.0, vllm/envs.py:654-660 (refused by vllm/platforms/interface.py:1492-1493)"


def env_refusals(parts: tuple[int, int, int], env: dict[str, str]) -> list[str]:
    """vLLM's ValueErrors, in its words, for the engine environment's runner and removed variables."""
    out = []
    value = env.get("VLLM_USE_V2_MODEL_RUNNER")
    if parts >= V1_RUNNER_REMOVED_SINCE and value is not None and value != "1":
        out.append(f"VLLM_USE_V2_MODEL_RUNNER={value} is no longer supported: Model Runner V1 has been removed. "
                   f"Unset this variable. ({V1_RUNNER_REMOVED_SOURCE})")
    for since, removed in REMOVED_ENV.items():
        if parts >= since:
            out += [f"{name} has been removed. {hint} ({REMOVED_ENV_SOURCE})" for name, hint in removed.items()
                    if name in env]
    return out


PENALTY_STATE_SOURCE = "vLLM 0.28.0, vllm/v1/worker/gpu/sample/penalties.py:32-42"
PENALTY_STATE_ELEMENT_BYTES = 4   # int32
PENALTY_MASK_BITS = 32


def rule_for(parts: tuple[int, int, int]) -> V2RunnerRule | None:
    rules = [r for r in V2_RUNNER_RULES if r.since <= parts]
    return rules[-1] if rules else None


def runs_v2_runner(parts: tuple[int, int, int], architectures: tuple[str, ...], moe: bool, hybrid: bool,
                   env_value: str | None = None) -> bool:
    """Whether the release's worker runs this model on the V2 runner (only known from 0.27).
    `env_value`: VLLM_USE_V2_MODEL_RUNNER as set (vllm/envs.py: maybe_convert_bool, int of the value)."""
    if parts >= V1_RUNNER_REMOVED_SINCE:
        return True   # the only runner left (a value other than 1 is refused: env_refusals)
    if env_value is not None and env_value.strip() in ("0", "1"):
        return env_value.strip() == "1"
    rule = rule_for(parts)
    if rule is None:
        return False
    if rule.every_model:
        return True
    listed = any(a in rule.listed_architectures for a in architectures)
    if hybrid and not listed:
        return False
    return listed or not moe


def penalty_state_bytes(max_num_seqs: int, vocab_size: int) -> int:
    """The V2 sampler's penalty statistics on the last pipeline stage (see PENALTY_STATE_SOURCE)."""
    words = -(-vocab_size // PENALTY_MASK_BITS)
    return max_num_seqs * (vocab_size + words) * PENALTY_STATE_ELEMENT_BYTES
