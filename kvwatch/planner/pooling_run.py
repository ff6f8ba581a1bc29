"""Whether vLLM serves a model with its pooling runner, and what that changes in the memory profile (pure).

A pooling run (embedding, reranking, classification, reward) profiles differently from a generative one:

- **Runner and convert type**, as vLLM resolves `--runner auto` and `--convert auto` (vLLM 0.19.1,
  vllm/config/model.py:828-850 `_get_default_runner_type`, :872-901 `_get_default_convert_type`): a
  Sentence Transformers pooling config beside the checkpoint makes it a pooling run; else the first
  architecture the release registers decides (registered as a pooling model: pooling, convert none; as
  text generation: generate); else the architecture name's suffix (:1845-1862 `_SUFFIX_TO_DEFAULTS`,
  first match wins). A pooling run of a model no suffix maps to the pooling runner converts to `embed`.
- **No sampler pass**: the profile runs the pooler instead of the sampler on the last pipeline stage
  (v1/worker/gpu_model_runner.py:5786-5789; from 0.10.2, :3033-3036 there).
- **The pooler's peak**: the pooler runs over the profile's hidden states once per task the model
  supports and again for the task with the largest output (gpu_model_runner.py:5700-5719). A converted
  embedding model supports `embed` and `token_embed` (model_executor/layers/pooler/special.py:28-35);
  `token_embed` returns every token's hidden state in the head dtype, float32 by default
  (pooler/tokwise/heads.py:69-70, config/model.py:1608-1618), held beside the hidden states.
  Classification heads return `num_labels` per token instead (special.py:37-50).
- **No LM head** where vLLM converts a generative model (`--convert embed|classify`,
  model_executor/model_loader/utils.py:195-203): from 0.15 the adapter never builds ParallelLMHead or
  the logits processor (model_executor/models/adapters.py:128-150, `StageMissingLayer`); tied
  embeddings stay, they are the input embedding. 0.10.2-0.14 built the head and deleted it after
  __init__ (0.10.2 adapters.py:185-192): not planned, the head stays counted there.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

from kvwatch.planner.engine_args import EngineSettings
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.architectures import ARCHITECTURES
from kvwatch.vllm_releases.generated.architectures import BASE_RELEASE

# vLLM decides by the registered class's interface (vLLM 0.19.1, vllm/model_executor/models/registry.py:1185-1199
# is_text_generation_model / is_pooling_model). The generated table records the registry group and the
# class name: a class in a pooling group (registry.py:214 _EMBEDDING_MODELS, :268 _LATE_INTERACTION_MODELS,
# :283 _REWARD_MODELS, :289 _TOKEN_CLASSIFICATION_MODELS, :302 _SEQUENCE_CLASSIFICATION_MODELS) is a pooling
# model unless its name is a generative one (`LlamaModel` registers LlamaForCausalLM, which vLLM converts);
# the Transformers backend's class names say which (TransformersEmbeddingModel, ...ForSequenceClassification);
# every other registered group builds generative classes.
POOLING_GROUPS = frozenset({"embedding", "late_interaction", "reward", "token_classification",
                            "sequence_classification"})
NOT_SERVED = frozenset({"previously_supported"})
BY_CLASS_NAME = frozenset({"transformers_backend"})

# vLLM 0.19.1, vllm/config/model.py:1845-1862: architecture suffix -> (runner, convert); first match wins.
SUFFIX_DEFAULTS: tuple[tuple[str, str, str], ...] = (
    ("ForCausalLM", "generate", "none"),
    ("ForConditionalGeneration", "generate", "none"),
    ("ChatModel", "generate", "none"),
    ("LMHeadModel", "generate", "none"),
    ("ForTextEncoding", "pooling", "embed"),
    ("EmbeddingModel", "pooling", "embed"),
    ("ForSequenceClassification", "pooling", "classify"),
    ("ForTokenClassification", "pooling", "classify"),
    ("ForAudioClassification", "pooling", "classify"),
    ("ForImageClassification", "pooling", "classify"),
    ("ForVideoClassification", "pooling", "classify"),
    ("ClassificationModel", "pooling", "classify"),
    ("ForRewardModeling", "pooling", "embed"),
    ("RewardModel", "pooling", "embed"),
    ("Model", "pooling", "embed"),
)
# 0.10.2-0.12: no ForTokenClassification entry, and reward models converted as "reward"
# (vLLM 0.10.2, vllm/config/__init__.py `_SUFFIX_TO_DEFAULTS`; 0.13.0 config/model.py changed both).
SUFFIX_DEFAULTS_BEFORE_0_13: tuple[tuple[str, str, str], ...] = tuple(
    (suffix, runner, "reward" if suffix in ("ForRewardModeling", "RewardModel") else convert)
    for suffix, runner, convert in SUFFIX_DEFAULTS if suffix != "ForTokenClassification")
SUFFIX_TABLE_SINCE = (0, 13, 0)

# The first release with `--runner`/`--convert` and the pooler-instead-of-sampler profile kvwatch plans
# (vLLM 0.10.2, vllm/engine/arg_utils.py:502-503; v1/worker/gpu_model_runner.py:3033-3036).
POOLING_RUNNER_SINCE = (0, 10, 2)
# The first release whose converting adapter never builds the LM head (vLLM 0.15.1,
# vllm/model_executor/models/adapters.py:144-149).
NO_LM_HEAD_SINCE = (0, 15, 0)
# transformers' PretrainedConfig default label count (id2label of two) where config.json names none
DEFAULT_NUM_LABELS = 2
HEAD_DTYPE_BYTES = 4   # pooling models' head dtype: float32 unless hf_overrides say "model" (config/model.py:1608-1618)


@dataclass(frozen=True)
class PoolingRun:
    runner: str    # "generate", "pooling" or "draft"
    convert: str   # "none", "embed", "classify", ...

    @property
    def pooling(self) -> bool:
        return self.runner == "pooling"

    @property
    def converted(self) -> bool:
        return self.convert not in ("none", "auto")


GENERATE = PoolingRun("generate", "none")


@cache
def registered_runners(release: str) -> Mapping[str, str]:
    """Each architecture `release` registers and the runner its class serves ("pooling" or "generate"),
    from the generated table; releases it does not record read its oldest (BASE_RELEASE): registrations
    as pooling or generative rarely move."""
    table = ARCHITECTURES.get(release) or ARCHITECTURES[BASE_RELEASE]
    out: dict[str, str] = {}
    for name, entry in table.items():
        if entry.group in NOT_SERVED:
            continue
        match = _suffix_match(entry.cls, SUFFIX_TABLE_SINCE)
        if entry.group in BY_CLASS_NAME:
            out[name] = match[0] if match else "generate"
        elif entry.group in POOLING_GROUPS:
            out[name] = "generate" if match and match[0] == "generate" else "pooling"
        else:
            out[name] = "generate"
    return out


def suffix_defaults(version: tuple[int, ...]) -> tuple[tuple[str, str, str], ...]:
    """The release's suffix table (config/model.py `_SUFFIX_TO_DEFAULTS`)."""
    return SUFFIX_DEFAULTS if version >= SUFFIX_TABLE_SINCE else SUFFIX_DEFAULTS_BEFORE_0_13


def _suffix_match(architecture: str, version: tuple[int, ...], runner: str | None = None) -> tuple[str, str] | None:
    for suffix, default_runner, default_convert in suffix_defaults(version):
        if (runner is None or runner == default_runner) and architecture.endswith(suffix):
            return default_runner, default_convert
    return None


def default_runner(architectures: tuple[str, ...], registered: Mapping[str, str], sentence_transformers: bool,
                   version: tuple[int, ...] = SUFFIX_TABLE_SINCE) -> str:
    """`--runner auto` (config/model.py:828-850); `registered`: registered_runners()."""
    if sentence_transformers:
        return "pooling"
    for arch in architectures:
        if arch in registered:
            return registered[arch]
        match = _suffix_match(arch, version)
        if match:
            return match[0]
    return "generate"


def default_convert(architectures: tuple[str, ...], runner: str, registered: Mapping[str, str],
                    version: tuple[int, ...] = SUFFIX_TABLE_SINCE) -> str:
    """`--convert auto` (config/model.py:872-901): none where a registered class serves the runner."""
    for arch in architectures:
        if registered.get(arch) == runner:
            return "none"
        match = _suffix_match(arch, version, runner)
        if match:
            return match[1]
    return "embed" if runner == "pooling" else "none"


def pooling_run(runner_flag: str, convert_flag: str, architectures: tuple[str, ...], registered: Mapping[str, str],
                sentence_transformers: bool = False, version: tuple[int, ...] = SUFFIX_TABLE_SINCE) -> PoolingRun:
    """The runner and convert type vLLM resolves (config/model.py:523-526). Releases before 0.10.2 are
    planned as generative runs (their `--task` selection is not modelled)."""
    if version < POOLING_RUNNER_SINCE:
        return GENERATE
    runner = runner_flag if runner_flag != "auto" else default_runner(architectures, registered, sentence_transformers, version)
    convert = convert_flag if convert_flag != "auto" else default_convert(architectures, runner, registered, version)
    return PoolingRun(runner, convert)


SENTENCE_TRANSFORMERS_POOLING = "sentence_transformers.models.Pooling"


def sentence_transformers_pooling(modules: object) -> bool:
    """Whether a checkpoint's modules.json (parsed) names a Sentence Transformers Pooling module: what
    vLLM's get_pooling_config answers a pooling config for (vLLM 0.19.1, vllm/transformers_utils/config.py:822-875),
    which makes `--runner auto` pick the pooling runner (config/model.py:836-837)."""
    return isinstance(modules, list) and any(
        isinstance(item, dict) and item.get("type") == SENTENCE_TRANSFORMERS_POOLING for item in modules)


def run_of(settings: EngineSettings, architectures: tuple[str, ...], version: VllmVersion | None,
           sentence_transformers: bool = False) -> PoolingRun:
    """The run an engine command asks for, for the release that serves it. `sentence_transformers`:
    the checkpoint's modules.json names a Pooling module (sentence_transformers_pooling)."""
    version = version or DEFAULT_RELEASE
    return pooling_run(settings.runner, settings.convert, architectures, registered_runners(str(version)),
                       sentence_transformers, version.parts)


def lm_head_params(run: PoolingRun, vocab_size: int, hidden_size: int, embedding_params: int,
                   version: tuple[int, ...]) -> int:
    """The LM head's parameters a converted model does not build: vocab x hidden where the checkpoint's
    head is its own tensor (untied: embedding_params counts vocab x hidden twice), none where tied."""
    if not run.converted or version < NO_LM_HEAD_SINCE or vocab_size <= 0 or hidden_size <= 0:
        return 0
    head = vocab_size * hidden_size
    return head if embedding_params >= 2 * head else 0


def pooler_peak_bytes(run: PoolingRun, tokens: int, hidden_size: int, dtype_bytes: int, num_labels: int) -> int:
    """The pooler's pass in the profile: the hidden states of `tokens` (model dtype) and the largest
    task's output, per token in the head dtype: the hidden size for an embedding model (`token_embed`),
    `num_labels` for a classifier (`token_classify`). 0 for a generative run."""
    if not run.pooling:
        return 0
    width = num_labels if run.convert == "classify" else hidden_size
    return tokens * (hidden_size * dtype_bytes + width * HEAD_DTYPE_BYTES)
