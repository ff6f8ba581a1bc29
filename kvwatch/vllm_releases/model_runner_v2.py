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
    listed_only: bool = False              # only the listed architectures (0.22-0.24)
    dense_unquantized_only: bool = False   # ... and of them only unquantized dense models (0.22, 0.23)
    hybrid_never: bool = False             # no hybrid, listed or not (0.25, 0.26)


_LISTED_0_27 = frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                          "InklingForConditionalGeneration", "KimiK3ForConditionalGeneration",
                          "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"})

_LISTED_0_24 = frozenset({"Qwen3ForCausalLM", "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM",
                          "LlamaForCausalLM", "MistralForCausalLM"})

# Oldest first. 0.20 and 0.21 run it only where VLLM_USE_V2_MODEL_RUNNER=1 asks (0.21.0 vllm/v1/worker/gpu_worker.py);
# the budget counts its state from 0.27 (TOTAL_CONSUMED_SINCE), and before 0.29 it makes no CUDA graph estimate
# (V2_GRAPH_ESTIMATE_SINCE).
V2_RUNNER_RULES = (
    V2RunnerRule((0, 22, 0), False, frozenset({"Qwen3ForCausalLM"}),
                 "vLLM 0.22.0, vllm/config/vllm.py:518 (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES :69; no hybrid: :1983)",
                 listed_only=True, dense_unquantized_only=True),
    V2RunnerRule((0, 23, 0), False, frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}),
                 "vLLM 0.23.0, vllm/config/vllm.py:544 (:69; no hybrid: :1990)", listed_only=True,
                 dense_unquantized_only=True),
    V2RunnerRule((0, 24, 0), False, _LISTED_0_24, "vLLM 0.24.0, vllm/config/vllm.py:550 (:68; no hybrid: :2002)",
                 listed_only=True),
    # a generate model that is neither MoE nor hybrid nor attention-free, or a listed MoE architecture
    V2RunnerRule((0, 25, 0), False, frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"}),
                 "vLLM 0.25.0, vllm/config/vllm.py:557 (:68); the same in 0.26.0", hybrid_never=True),
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


# The V2 runner's CUDA graph estimate: none before 0.29 ("TBD whether we keep this API": 0.20.0
# vllm/v1/worker/gpu/model_runner.py:573, 0.28.0 :843-845), so a V2 start takes no graph memory from the KV
# cache there; from 0.29 it estimates as the V1 runner does (0.29.0 :896-898).
V2_GRAPH_ESTIMATE_SINCE = (0, 29, 0)
V2_GRAPH_ESTIMATE_SOURCE = "vLLM 0.29.0, vllm/v1/worker/gpu/model_runner.py:896-898 (0 in 0.20.0-0.28.0, 0.28.0 :843-845)"


def runs_v2_runner(parts: tuple[int, int, int], architectures: tuple[str, ...], moe: bool, hybrid: bool,
                   env_value: str | None = None, quantized: bool = False) -> bool:
    """Whether the release's worker runs this model on the V2 runner (V2_RUNNER_RULES).
    `env_value`: VLLM_USE_V2_MODEL_RUNNER as set (vllm/envs.py: maybe_convert_bool, int of the value);
    `quantized`: the checkpoint or the flags quantize the weights."""
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
    if rule.listed_only:
        return listed and not hybrid and not (rule.dense_unquantized_only and (moe or quantized))
    if hybrid and (rule.hybrid_never or not listed):
        return False
    return listed or not moe


def graph_estimate_taken(parts: tuple[int, int, int], v2_runner: bool) -> bool:
    """Whether the runner estimates CUDA graph memory for the budget to take (V2_GRAPH_ESTIMATE_SINCE)."""
    return not v2_runner or parts >= V2_GRAPH_ESTIMATE_SINCE


def penalty_state_bytes(max_num_seqs: int, vocab_size: int) -> int:
    """The V2 sampler's penalty statistics on the last pipeline stage (see PENALTY_STATE_SOURCE)."""
    words = -(-vocab_size // PENALTY_MASK_BITS)
    return max_num_seqs * (vocab_size + words) * PENALTY_STATE_ELEMENT_BYTES
